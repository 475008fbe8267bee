"""gpu-share scheduler extender: kube-scheduler HTTP extender (filter, prioritize, bind)
placing pods with the cluster policy of ``gpu_share.sharing.placement``."""
