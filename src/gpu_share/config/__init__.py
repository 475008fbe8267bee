"""gpu_share.config"""
