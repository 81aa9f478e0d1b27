// Command dragolden runs Kubernetes' own structured allocator (k8s.io/dynamic-resource-allocation/structured, with
// the feature set kube-scheduler v1.36 enables by default) on the cases read from standard input and writes what
// it allocates, so that hoss.model.devices can be held to it.
//
// Input: a JSON list of cases {name, slices, classes, claims, node: {name, labels}, allocated: [[driver, pool,
// device]...]}. Output: a JSON list of {name, allocation: [AllocationResult per claim] or null, error,
// failedOnNode}, in the same order.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/dynamic-resource-allocation/cel"
	"k8s.io/dynamic-resource-allocation/structured"
)

type node struct {
	Name   string            `json:"name"`
	Labels map[string]string `json:"labels"`
}

type testCase struct {
	Name      string                       `json:"name"`
	Slices    []*resourceapi.ResourceSlice `json:"slices"`
	Classes   []*resourceapi.DeviceClass   `json:"classes"`
	Claims    []*resourceapi.ResourceClaim `json:"claims"`
	Node      node                         `json:"node"`
	Allocated [][3]string                  `json:"allocated"`
}

type outcome struct {
	Name         string                         `json:"name"`
	Allocation   []resourceapi.AllocationResult `json:"allocation"`
	Error        string                         `json:"error,omitempty"`
	FailedOnNode bool                           `json:"failedOnNode,omitempty"`
}

// classLister serves the case's DeviceClasses; a missing one is NotFound, as the informer's lister says.
type classLister map[string]*resourceapi.DeviceClass

func (l classLister) List() ([]*resourceapi.DeviceClass, error) {
	classes := make([]*resourceapi.DeviceClass, 0, len(l))
	for _, class := range l {
		classes = append(classes, class)
	}
	return classes, nil
}

func (l classLister) Get(name string) (*resourceapi.DeviceClass, error) {
	class, found := l[name]
	if !found {
		return nil, apierrors.NewNotFound(resourceapi.Resource("deviceclasses"), name)
	}
	return class, nil
}

// kube-scheduler v1.36's defaults (pkg/scheduler/framework/plugins/dynamicresources AllocatorFeatures): DRAAdminAccess,
// DRAPrioritizedList, DRAPartitionableDevices, DRADeviceTaints, DRADeviceBindingConditions with
// DRAResourceClaimDeviceStatus, and DRAConsumableCapacity are on; DRAListTypeAttributes is alpha and off.
var features = structured.Features{
	AdminAccess:            true,
	PrioritizedList:        true,
	PartitionableDevices:   true,
	DeviceTaints:           true,
	DeviceBindingAndStatus: true,
	ConsumableCapacity:     true,
}

func run(ctx context.Context, c testCase) outcome {
	lister := classLister{}
	for _, class := range c.Classes {
		lister[class.Name] = class
	}
	allocated := sets.New[structured.DeviceID]()
	for _, id := range c.Allocated {
		allocated.Insert(structured.MakeDeviceID(id[0], id[1], id[2]))
	}
	state := structured.AllocatedState{
		AllocatedDevices:         allocated,
		AllocatedSharedDeviceIDs: sets.New[structured.SharedDeviceID](),
		AggregatedCapacity:       structured.NewConsumedCapacityCollection(),
	}
	celCache := cel.NewCache(10, cel.Features{EnableConsumableCapacity: features.ConsumableCapacity})
	allocator, err := structured.NewAllocator(ctx, features, state, lister, c.Slices, celCache)
	if err != nil {
		return outcome{Name: c.Name, Error: err.Error()}
	}
	theNode := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: c.Node.Name, Labels: c.Node.Labels}}
	results, err := allocator.Allocate(ctx, theNode, c.Claims)
	if err != nil {
		return outcome{Name: c.Name, Error: err.Error(), FailedOnNode: errors.Is(err, structured.ErrFailedAllocationOnNode)}
	}
	if len(results) != len(c.Claims) {
		return outcome{Name: c.Name}
	}
	return outcome{Name: c.Name, Allocation: results}
}

func main() {
	var cases []testCase
	if err := json.NewDecoder(os.Stdin).Decode(&cases); err != nil {
		fmt.Fprintf(os.Stderr, "read cases: %v\n", err)
		os.Exit(1)
	}
	ctx := context.Background()
	outcomes := make([]outcome, 0, len(cases))
	for _, c := range cases {
		outcomes = append(outcomes, run(ctx, c))
	}
	out := json.NewEncoder(os.Stdout)
	out.SetIndent("", "  ")
	if err := out.Encode(outcomes); err != nil {
		fmt.Fprintf(os.Stderr, "write outcomes: %v\n", err)
		os.Exit(1)
	}
}
