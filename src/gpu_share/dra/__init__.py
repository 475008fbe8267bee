"""DRA front-end: the kubelet DRA plugin (registration + NodePrepare/Unprepare) over gRPC."""
