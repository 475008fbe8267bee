// Command dra-allocator times k8s.io/dynamic-resource-allocation's structured allocator
// (NewAllocator + Allocate for one node, the work of the scheduler's DRA Filter) on
// gpu-share's DRA shapes: one ResourceSlice per node with 8 shareable GPUs
// (allowMultipleAllocations, consumable "memory" 81920Mi in 1024Mi steps and "cores" 100),
// and the webhook's claims (request "slice", ExactCount; whole GPUs ask cores=100 each,
// a shared slice asks cores+memory with count 1). The same file is built against v0.35.4
// (kube-scheduler 1.35's module graph) and v0.36.5 by build.sh; run.sh merges both outputs.
// Each row: median wall time per Allocate call, allocateOne invocations per call (read from
// the experimental allocator's GetStats), and whether it allocated. Every call runs under
// the scheduler's default 10s DRA filter timeout.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"reflect"
	"runtime/debug"
	"sort"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/dynamic-resource-allocation/cel"
	"k8s.io/dynamic-resource-allocation/structured"

	v1 "k8s.io/api/core/v1"
)

const (
	driver     = "gpu.vendor.com"
	gpus       = 8
	memMiB     = 81920
	unitMiB    = 1024
	reqName    = "slice"
	filterTout = 10 * time.Second // kube-scheduler's DynamicResourcesFilterTimeoutDefault
)

// features: kube-scheduler 1.35 defaults (DRAAdminAccess and DRAPrioritizedList are beta,
// on; DRADeviceTaints, DRAPartitionableDevices and DRADeviceBindingConditions are alpha,
// off) plus DRAConsumableCapacity, which the cluster enables.
var features = structured.Features{
	AdminAccess:        true,
	PrioritizedList:    true,
	ConsumableCapacity: true,
}

type classLister struct{ class *resourceapi.DeviceClass }

func (l classLister) List() ([]*resourceapi.DeviceClass, error) {
	return []*resourceapi.DeviceClass{l.class}, nil
}

func (l classLister) Get(name string) (*resourceapi.DeviceClass, error) {
	if name == l.class.Name {
		return l.class, nil
	}
	return nil, fmt.Errorf("deviceclass %q not found", name)
}

func qp(s string) *resource.Quantity { q := resource.MustParse(s); return &q }

func mi(n int) string { return fmt.Sprintf("%dMi", n) }

// slice is what slices.py publishes for a node with 8 healthy GPUs.
func slice(node string) *resourceapi.ResourceSlice {
	s := &resourceapi.ResourceSlice{
		ObjectMeta: metav1.ObjectMeta{Name: node + "-gpu-share-x"},
		Spec: resourceapi.ResourceSliceSpec{
			Driver:   driver,
			NodeName: &node,
			Pool:     resourceapi.ResourcePool{Name: node, Generation: 1, ResourceSliceCount: 1},
		},
	}
	for i := 0; i < gpus; i++ {
		idx, unit := int64(i), int64(unitMiB)
		uuid, model, dv := fmt.Sprintf("GPU-%s-%d", node, i), "NVIDIA A100-SXM4-80GB", "550.54.15"
		s.Spec.Devices = append(s.Spec.Devices, resourceapi.Device{
			Name: fmt.Sprintf("gpu-%d", i),
			Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{
				"uuid":          {StringValue: &uuid},
				"model":         {StringValue: &model},
				"index":         {IntValue: &idx},
				"driverVersion": {StringValue: &dv},
				"memoryUnitMiB": {IntValue: &unit},
			},
			Capacity: map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{
				"memory": {
					Value: resource.MustParse(mi(memMiB)),
					RequestPolicy: &resourceapi.CapacityRequestPolicy{
						Default:    qp(mi(memMiB)),
						ValidRange: &resourceapi.CapacityRequestPolicyRange{Min: qp(mi(unitMiB)), Step: qp(mi(unitMiB))},
					},
				},
				"cores": {
					Value: resource.MustParse("100"),
					RequestPolicy: &resourceapi.CapacityRequestPolicy{
						Default:    qp("0"),
						ValidRange: &resourceapi.CapacityRequestPolicyRange{Min: qp("0"), Step: qp("1")},
					},
				},
			},
			AllowMultipleAllocations: ptr(true),
		})
	}
	return s
}

func ptr[T any](v T) *T { return &v }

// claim is what template_body asks: cores >= 100 -> count cores/100 of {cores: 100};
// else count 1 of {cores, memory}.
func claim(name string, cores, memoryMiB int) *resourceapi.ResourceClaim {
	req := resourceapi.ExactDeviceRequest{
		DeviceClassName: driver,
		AllocationMode:  resourceapi.DeviceAllocationModeExactCount,
		Count:           1,
	}
	caps := map[resourceapi.QualifiedName]resource.Quantity{}
	if cores >= 100 {
		req.Count = int64(cores / 100)
		caps["cores"] = resource.MustParse("100")
	} else {
		caps["cores"] = resource.MustParse(fmt.Sprint(cores))
		if memoryMiB > 0 {
			caps["memory"] = resource.MustParse(mi(memoryMiB))
		}
	}
	req.Capacity = &resourceapi.CapacityRequirements{Requests: caps}
	return &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "bench", UID: types.UID("uid-" + name)},
		Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{
			Requests: []resourceapi.DeviceRequest{{Name: reqName, Exactly: &req}},
		}},
	}
}

// used: per-GPU consumption of earlier shares on one node (cores, memory MiB).
type used map[int][2]int

func allocated(nodes []string, u used) structured.AllocatedState {
	st := structured.AllocatedState{
		AllocatedDevices:         sets.New[structured.DeviceID](),
		AllocatedSharedDeviceIDs: sets.New[structured.SharedDeviceID](),
		AggregatedCapacity:       structured.NewConsumedCapacityCollection(),
	}
	for _, node := range nodes {
		for i, c := range u {
			id := structured.MakeDeviceID(driver, node, fmt.Sprintf("gpu-%d", i))
			st.AggregatedCapacity[id] = structured.ConsumedCapacity{
				"cores":  qp(fmt.Sprint(c[0])),
				"memory": qp(mi(c[1])),
			}
			uid := types.UID(fmt.Sprintf("share-%s-%d", node, i))
			st.AllocatedSharedDeviceIDs.Insert(structured.MakeSharedDeviceID(id, &uid))
		}
	}
	return st
}

func all(c [2]int) used {
	u := used{}
	for i := 0; i < gpus; i++ {
		u[i] = c
	}
	return u
}

// busy: GPUs 0..n-1 carry a small share (10 cores, 8Gi), the rest are free.
func busy(n int) used {
	u := used{}
	for i := 0; i < n; i++ {
		u[i] = [2]int{10, 8192}
	}
	return u
}

type scenario struct {
	name   string
	used   used
	claims []*resourceapi.ResourceClaim
}

func scenarios() []scenario {
	shared := func(n int, last [2]int) []*resourceapi.ResourceClaim {
		var cs []*resourceapi.ResourceClaim
		for i := 0; i < n-1; i++ {
			cs = append(cs, claim(fmt.Sprintf("c%d", i), 30, 8192))
		}
		return append(cs, claim(fmt.Sprintf("c%d", n-1), last[0], last[1]))
	}
	return []scenario{
		{"1 8 whole, 8 free", used{}, []*resourceapi.ResourceClaim{claim("c0", 800, 0)}},
		{"2a 8 whole, 7 free", busy(1), []*resourceapi.ResourceClaim{claim("c0", 800, 0)}},
		{"2b 8 whole, 6 free", busy(2), []*resourceapi.ResourceClaim{claim("c0", 800, 0)}},
		{"2c 4 whole, 3 free", busy(5), []*resourceapi.ResourceClaim{claim("c0", 400, 0)}},
		{"2d 2 whole, 1 free", busy(7), []*resourceapi.ResourceClaim{claim("c0", 200, 0)}},
		{"3a shared 30c/8Gi, room", busy(8), []*resourceapi.ResourceClaim{claim("c0", 30, 8192)}},
		{"3b shared 30c/8Gi, no room", all([2]int{80, 40960}), []*resourceapi.ResourceClaim{claim("c0", 30, 8192)}},
		// every GPU has 50 cores used: three 30-core slices fit, a 60-core 4th fits nowhere.
		{"4 4 claims, 4th fits nowhere", all([2]int{50, 20480}), shared(4, [2]int{60, 8192})},
	}
}

// stats reads the experimental allocator's GetStats().NumAllocateOneInvocations (the
// Stats type is internal, hence reflection); -1 when not available.
func stats(a structured.Allocator) int64 {
	m := reflect.ValueOf(a).MethodByName("GetStats")
	if !m.IsValid() {
		return -1
	}
	f := m.Call(nil)[0].FieldByName("NumAllocateOneInvocations")
	if !f.IsValid() {
		return -1
	}
	return f.Int()
}

func node(name string) *v1.Node { return &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}} }

type outcome struct {
	result string
	d      time.Duration
	calls  int64
}

func allocateOnce(a structured.Allocator, n *v1.Node, claims []*resourceapi.ResourceClaim) outcome {
	ctx, cancel := context.WithTimeout(context.Background(), filterTout)
	defer cancel()
	before := stats(a)
	start := time.Now()
	res, err := a.Allocate(ctx, n, claims)
	d := time.Since(start)
	o := outcome{d: d, calls: stats(a) - before}
	switch {
	case err != nil && ctx.Err() != nil:
		o.result = "timeout"
	case err != nil && errors.Is(err, structured.ErrFailedAllocationOnNode):
		o.result = "no"
	case err != nil:
		o.result = "error: " + err.Error()
	case len(res) == len(claims):
		o.result = "yes"
	default:
		o.result = "no"
	}
	return o
}

func median(ds []time.Duration) time.Duration {
	s := append([]time.Duration(nil), ds...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	return s[len(s)/2]
}

func human(d time.Duration) string {
	switch {
	case d >= time.Second:
		return fmt.Sprintf("%.2f s", d.Seconds())
	case d >= time.Millisecond:
		return fmt.Sprintf("%.2f ms", float64(d)/1e6)
	default:
		return fmt.Sprintf("%.1f µs", float64(d)/1e3)
	}
}

func libVersion() string {
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, d := range bi.Deps {
			if d.Path == "k8s.io/dynamic-resource-allocation" {
				return d.Version
			}
		}
	}
	return "?"
}

func newAllocator(ctx context.Context, st structured.AllocatedState, slices []*resourceapi.ResourceSlice) structured.Allocator {
	class := &resourceapi.DeviceClass{
		ObjectMeta: metav1.ObjectMeta{Name: driver},
		Spec: resourceapi.DeviceClassSpec{Selectors: []resourceapi.DeviceSelector{{
			CEL: &resourceapi.CELDeviceSelector{Expression: fmt.Sprintf("device.driver == %q", driver)},
		}}},
	}
	cache := cel.NewCache(10, cel.Features{EnableConsumableCapacity: true})
	a, err := structured.NewAllocator(ctx, features, st, classLister{class}, slices, cache)
	if err != nil {
		fmt.Fprintln(os.Stderr, "NewAllocator:", err)
		os.Exit(1)
	}
	return a
}

func main() {
	maxRepeats := flag.Int("repeats", 15, "at most this many Allocate calls per scenario")
	budget := flag.Duration("budget", 2*time.Second, "stop repeating a scenario after this much time (at least 3 calls unless one exceeds it)")
	clusterNodes := flag.Int("cluster-nodes", 1000, "nodes of the scenario-2a cluster pass (0: skip)")
	clusterBudget := flag.Duration("cluster-budget", 30*time.Second, "stop the cluster pass after this long and extrapolate")
	flag.Parse()
	ver := libVersion()
	ctx := context.Background()

	// Tab-separated: order, scenario, version, allocated, median, allocateOne/call, repeats.
	for i, sc := range scenarios() {
		a := newAllocator(ctx, allocated([]string{"node-0"}, sc.used), []*resourceapi.ResourceSlice{slice("node-0")})
		n := node("node-0")
		var ds []time.Duration
		var first outcome
		start := time.Now()
		for r := 0; r < *maxRepeats; r++ {
			o := allocateOnce(a, n, sc.claims)
			if r == 0 {
				first = o
			}
			ds = append(ds, o.d)
			el := time.Since(start)
			if el > *budget && (r >= 2 || o.d > *budget) {
				break
			}
		}
		fmt.Printf("%d\t%s\t%s\t%s\t%s\t%d\t%d\n", i, sc.name, ver, first.result, human(median(ds)), first.calls, len(ds))
	}

	if *clusterNodes > 0 {
		// One allocator over all nodes' slices (as the scheduler's PreFilter builds it),
		// Allocate per node (Filter), sequentially, every node in the 2a state.
		var names []string
		var slices []*resourceapi.ResourceSlice
		for i := 0; i < *clusterNodes; i++ {
			names = append(names, fmt.Sprintf("node-%d", i))
			slices = append(slices, slice(names[i]))
		}
		claims := []*resourceapi.ResourceClaim{claim("c0", 800, 0)}
		a := newAllocator(ctx, allocated(names, busy(1)), slices)
		start := time.Now()
		done, fits := 0, 0
		var calls int64
		for _, nm := range names {
			o := allocateOnce(a, node(nm), claims)
			calls += o.calls
			if o.result == "yes" {
				fits++
			}
			done++
			if time.Since(start) > *clusterBudget {
				break
			}
		}
		el := time.Since(start)
		est := time.Duration(float64(el) / float64(done) * 1213)
		fmt.Printf("%d\t%s\t%s\t%s\t%s\t%d\t%d\n", 100,
			fmt.Sprintf("ESTIMATE 2a on 1,213 nodes, sequential (ran %d of %d nodes in %s, scaled)", done, *clusterNodes, human(el)),
			ver, fmt.Sprintf("%d fit", fits), human(est), calls/int64(done), done)
	}
}
