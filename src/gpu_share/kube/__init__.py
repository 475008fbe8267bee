"""gpu_share.kube"""
