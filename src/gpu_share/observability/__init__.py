"""gpu_share.observability"""
