"""gpu_share.plugin"""
