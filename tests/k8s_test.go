package tests

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"sigs.k8s.io/yaml"
)

// TestBalancerExamples checks the examples docs/OPERATIONS.md gives for one
// address in front of every node. docs/balancer/haproxy.cfg must pass
// haproxy's own check. docs/balancer/moonraft-k8s.yaml is checked for syntax
// and wiring only (no Kubernetes cluster runs here): each document parses,
// the client Service selects the StatefulSet's pods on their Mooncake port,
// and the pods are ready by /readyz on their HTTP port.
func TestBalancerExamples(t *testing.T) {
	docs := filepath.Join(testsDir(), "..", "docs", "balancer")
	out, err := exec.Command(haproxyBin(t), "-c", "-f", filepath.Join(docs, "haproxy.cfg")).CombinedOutput()
	require.NoError(t, err, "haproxy -c:\n%s", out)

	raw, err := os.ReadFile(filepath.Join(docs, "moonraft-k8s.yaml"))
	require.NoError(t, err)
	type port struct {
		Name          string `json:"name"`
		Port          int    `json:"port"`
		TargetPort    any    `json:"targetPort"`
		ContainerPort int    `json:"containerPort"`
	}
	type object struct {
		APIVersion string `json:"apiVersion"`
		Kind       string `json:"kind"`
		Metadata   struct {
			Name string `json:"name"`
		} `json:"metadata"`
		Spec struct {
			Selector    map[string]any `json:"selector"`
			Ports       []port         `json:"ports"`
			ServiceName string         `json:"serviceName"`
			Replicas    int            `json:"replicas"`
			Template    struct {
				Metadata struct {
					Labels map[string]string `json:"labels"`
				} `json:"metadata"`
				Spec struct {
					Containers []struct {
						Ports          []port `json:"ports"`
						ReadinessProbe struct {
							HTTPGet struct {
								Path string `json:"path"`
								Port string `json:"port"`
							} `json:"httpGet"`
						} `json:"readinessProbe"`
					} `json:"containers"`
				} `json:"spec"`
			} `json:"template"`
		} `json:"spec"`
	}
	byName := map[string]object{}
	for _, doc := range bytes.Split(raw, []byte("\n---\n")) {
		j, err := yaml.YAMLToJSONStrict(doc) // duplicate keys are errors too
		require.NoError(t, err, "a document of moonraft-k8s.yaml:\n%s", doc)
		var o object
		require.NoError(t, json.Unmarshal(j, &o))
		require.NotEmpty(t, o.APIVersion)
		byName[o.Kind+"/"+o.Metadata.Name] = o
	}
	svc, ok := byName["Service/moonraft-mooncake"]
	require.True(t, ok, "the clients' Service")
	sts, ok := byName["StatefulSet/moonraft"]
	require.True(t, ok, "the nodes")
	_, ok = byName["Service/"+sts.Spec.ServiceName]
	assert.True(t, ok, "the StatefulSet's governing Service exists")
	assert.Equal(t, 3, sts.Spec.Replicas)
	for k, v := range svc.Spec.Selector {
		assert.Equal(t, v, sts.Spec.Template.Metadata.Labels[k], "the Service selects the nodes' pods")
	}
	require.Len(t, svc.Spec.Ports, 1)
	require.Len(t, sts.Spec.Template.Spec.Containers, 1)
	ctr := sts.Spec.Template.Spec.Containers[0]
	named := map[string]int{}
	for _, p := range ctr.Ports {
		named[p.Name] = p.ContainerPort
	}
	assert.Equal(t, 50051, named[svc.Spec.Ports[0].TargetPort.(string)], "the Service sends clients to the Mooncake port")
	assert.Equal(t, "/readyz", ctr.ReadinessProbe.HTTPGet.Path)
	assert.Equal(t, 7300, named[ctr.ReadinessProbe.HTTPGet.Port], "readiness on the HTTP port")
}
