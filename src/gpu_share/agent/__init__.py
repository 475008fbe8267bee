"""gpu_share.agent"""
