"""gpu_share.devices"""
