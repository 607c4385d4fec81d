// monitoring-check reads YAML documents on stdin and decodes each ServiceMonitor and
// PrometheusRule strictly into the Prometheus Operator's own API types (the types its CRDs are
// generated from): an unknown field or a value of the wrong type is an error naming the
// document. It prints one line per document checked; exit 1 on the first problem.
package main

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"os"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"
)

func main() {
	r := utilyaml.NewYAMLReader(bufio.NewReader(os.Stdin))
	checked := 0
	for {
		doc, err := r.Read()
		if err == io.EOF {
			break
		}
		if err != nil {
			fail("reading the documents: %v", err)
		}
		if len(bytes.TrimSpace(doc)) == 0 {
			continue
		}
		var meta struct {
			APIVersion string `json:"apiVersion"`
			Kind       string `json:"kind"`
			Metadata   struct {
				Name string `json:"name"`
			} `json:"metadata"`
		}
		if err := yaml.Unmarshal(doc, &meta); err != nil {
			fail("a document does not parse: %v", err)
		}
		var into any
		switch meta.Kind {
		case "ServiceMonitor":
			into = &monitoringv1.ServiceMonitor{}
		case "PrometheusRule":
			into = &monitoringv1.PrometheusRule{}
		default:
			continue
		}
		if meta.APIVersion != "monitoring.coreos.com/v1" {
			fail("%s %s: apiVersion %q is not monitoring.coreos.com/v1", meta.Kind, meta.Metadata.Name, meta.APIVersion)
		}
		if err := yaml.UnmarshalStrict(doc, into); err != nil {
			fail("%s %s: %v", meta.Kind, meta.Metadata.Name, err)
		}
		fmt.Printf("%s %s: valid\n", meta.Kind, meta.Metadata.Name)
		checked++
	}
	if checked == 0 {
		fail("no ServiceMonitor or PrometheusRule on stdin")
	}
}

func fail(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "monitoring-check: "+format+"\n", args...)
	os.Exit(1)
}
