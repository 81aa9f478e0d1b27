// Command protobufgolden writes the golden bytes that tests/unit/test_protobuf_golden.py holds hoss's protobuf
// encoder (hoss/kube/protobuf.py) to: for each case of a JSON list read on stdin ({"name", "object"}, the object a
// core/v1 Binding or Event as JSON), the bytes Kubernetes' own protobuf serializer writes for it (the "k8s\x00"
// magic and the runtime.Unknown envelope, as client-go sends a body and the apiserver decodes it), in hex. Each
// object is read with the apiserver's strict JSON decoder, so a misspelt field in a case fails here, and its bytes
// are decoded back to check that the apiserver reads them as the same object.
//
// Regenerate from this directory: go run . < cases.json > golden.json
package main

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"reflect"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	jsonserializer "k8s.io/apimachinery/pkg/runtime/serializer/json"
	"k8s.io/apimachinery/pkg/runtime/serializer/protobuf"
)

type input struct {
	Name   string          `json:"name"`
	Object json.RawMessage `json:"object"`
}

type golden struct {
	Name     string          `json:"name"`
	Object   json.RawMessage `json:"object"`
	Protobuf string          `json:"protobuf"`
}

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "protobufgolden:", err)
		os.Exit(1)
	}
}

func run() error {
	scheme := runtime.NewScheme()
	if err := corev1.AddToScheme(scheme); err != nil {
		return err
	}
	fromJSON := jsonserializer.NewSerializerWithOptions(jsonserializer.DefaultMetaFactory, scheme, scheme,
		jsonserializer.SerializerOptions{Strict: true})
	wire := protobuf.NewSerializer(scheme, scheme)

	var cases []input
	decoder := json.NewDecoder(os.Stdin)
	decoder.DisallowUnknownFields()
	if err := decoder.Decode(&cases); err != nil {
		return fmt.Errorf("reading the cases: %w", err)
	}
	out := make([]golden, 0, len(cases))
	seen := map[string]bool{}
	for _, c := range cases {
		if c.Name == "" || seen[c.Name] {
			return fmt.Errorf("case %q: every case needs a name of its own", c.Name)
		}
		seen[c.Name] = true
		encoded, err := encode(c.Object, fromJSON, wire)
		if err != nil {
			return fmt.Errorf("case %q: %w", c.Name, err)
		}
		out = append(out, golden{Name: c.Name, Object: c.Object, Protobuf: hex.EncodeToString(encoded)})
	}
	encoder := json.NewEncoder(os.Stdout)
	encoder.SetEscapeHTML(false)
	encoder.SetIndent("", "  ")
	return encoder.Encode(out)
}

// encode reads one object as the apiserver reads a JSON body and writes it as client-go writes a protobuf body.
func encode(object []byte, fromJSON runtime.Decoder, wire runtime.Serializer) ([]byte, error) {
	decoded, _, err := fromJSON.Decode(object, nil, nil)
	if err != nil {
		return nil, err
	}
	switch decoded.(type) {
	case *corev1.Binding, *corev1.Event:
	default:
		return nil, fmt.Errorf("a %T: only core/v1 Binding and Event are encoded by hoss", decoded)
	}
	var encoded bytes.Buffer
	if err := wire.Encode(decoded, &encoded); err != nil {
		return nil, err
	}
	back, _, err := wire.Decode(encoded.Bytes(), nil, nil)
	if err != nil {
		return nil, fmt.Errorf("decoding its own protobuf: %w", err)
	}
	if !reflect.DeepEqual(back, decoded) {
		return nil, fmt.Errorf("its protobuf decodes to %+v, not %+v", back, decoded)
	}
	return encoded.Bytes(), nil
}
