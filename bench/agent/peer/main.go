// Command peer is the Go baseline for bench/agent: Kubernetes' sample device plugin
// (test/images/sample-device-plugin) with a configurable device count, because the
// upstream binary hard-codes two devices and the admission benchmark needs 50.
//
// It uses the same upstream stub (k8s.io/kubernetes/pkg/kubelet/cm/devicemanager/
// plugin/v1beta1) and answers Allocate the same way (one empty /tmp file per device,
// mounted into the container), so its cost per call matches the sample plugin's.
//
//	PEER_DEVICE_COUNT=64 peer     # registers example.com/resource with Dev-1..Dev-64
//
// PLUGIN_SOCK_DIR (default the kubelet's device-plugin dir) holds its socket;
// PEER_KUBELET_SOCKET (default the kubelet's) is where it registers.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	"k8s.io/klog/v2"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
	plugin "k8s.io/kubernetes/pkg/kubelet/cm/devicemanager/plugin/v1beta1"
)

const resourceName = "example.com/resource"

func allocate(r *pluginapi.AllocateRequest, devs map[string]*pluginapi.Device) (*pluginapi.AllocateResponse, error) {
	out := &pluginapi.AllocateResponse{}
	for _, req := range r.ContainerRequests {
		resp := &pluginapi.ContainerAllocateResponse{}
		for _, id := range req.DevicesIds {
			dev, ok := devs[id]
			if !ok {
				return nil, fmt.Errorf("unknown device %s", id)
			}
			if dev.Health != pluginapi.Healthy {
				return nil, fmt.Errorf("unhealthy device %s", id)
			}
			path := filepath.Join("/tmp", dev.ID)
			if err := os.RemoveAll(path); err != nil {
				return nil, err
			}
			f, err := os.Create(path)
			if err != nil {
				return nil, err
			}
			f.Close()
			resp.Mounts = append(resp.Mounts, &pluginapi.Mount{ContainerPath: path, HostPath: path})
		}
		out.ContainerResponses = append(out.ContainerResponses, resp)
	}
	return out, nil
}

func main() {
	count := 2
	if v := os.Getenv("PEER_DEVICE_COUNT"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			klog.Fatalf("PEER_DEVICE_COUNT=%q is not a positive integer", v)
		}
		count = n
	}
	devs := make([]*pluginapi.Device, 0, count)
	for i := 1; i <= count; i++ {
		devs = append(devs, &pluginapi.Device{ID: fmt.Sprintf("Dev-%d", i), Health: pluginapi.Healthy})
	}
	dir := os.Getenv("PLUGIN_SOCK_DIR")
	if dir == "" {
		dir = pluginapi.DevicePluginPath
	}
	kubelet := os.Getenv("PEER_KUBELET_SOCKET")
	if kubelet == "" {
		kubelet = pluginapi.KubeletSocket
	}
	sigCh := make(chan os.Signal, 1)
	signal.Notify(sigCh, syscall.SIGHUP, syscall.SIGINT, syscall.SIGTERM, syscall.SIGQUIT)

	// Since Kubernetes 1.35 the stub takes a logger and a context, as the sample plugin
	// passes them.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	logger := klog.FromContext(ctx)
	socket := filepath.Join(dir, fmt.Sprintf("peer.%d", time.Now().UnixNano()))
	stub := plugin.NewDevicePluginStub(logger, devs, socket, resourceName, false, false)
	if err := stub.Start(ctx); err != nil {
		klog.Fatalf("start: %v", err)
	}
	stub.SetAllocFunc(allocate)
	if err := stub.Register(ctx, kubelet, resourceName, dir); err != nil {
		klog.Fatalf("register: %v", err)
	}
	klog.InfoS("registered", "resource", resourceName, "devices", count)
	go stub.Watch(ctx, kubelet, resourceName, dir)
	sig := <-sigCh
	klog.InfoS("shutting down", "signal", sig)
	if err := stub.Stop(logger); err != nil {
		klog.Fatalf("stop: %v", err)
	}
}
