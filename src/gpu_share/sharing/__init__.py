"""gpu_share.sharing"""
