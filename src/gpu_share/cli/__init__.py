"""gpu_share.cli"""
