package main

import (
	"encoding/json"
	"fmt"
	"os"
	"reflect"
	"sort"
	"strings"
	"testing"

	"github.com/orchard-env/orchard/agent/internal/api"
	execapi "github.com/orchard-env/orchard/agent/internal/exec"
	"github.com/orchard-env/orchard/agent/internal/files"
	"github.com/orchard-env/orchard/agent/internal/proc"
)

// The wire contract has one source: the pydantic models in src/orchard/env/models.py.
// testdata/wire_schema.json holds their JSON Schema ({name: model_json_schema(by_alias=True)});
// regenerate it from the Python side when a model changes (from the repository root:
//   PYTHONPATH=src python -c 'import json; from orchard.env import models as m; print(json.dumps(
//     {n: getattr(m, n).model_json_schema(by_alias=True) for n in NAMES}, indent=1, sort_keys=True))'
// with NAMES the schemas of wirePairs below). This test checks every
// request and response struct of the agent against it: every Python field is known to
// Go (or listed below as one the agent never sees, with why), every Go field is known
// to Python, and their basic JSON types agree in the direction the data flows.

type direction int

const (
	request  direction = iota // service → agent: Go must decode what Python may send
	response                  // agent → service: Python must accept what Go sends
)

// wirePairs maps each schema to the Go structs that carry it on the wire.
var wirePairs = []struct {
	schema string
	dir    direction
	goType []any
}{
	{"ExecRequest", request, []any{execapi.ExecRequest{}}},
	{"ProcessStart", request, []any{execapi.ProcessStart{}}},
	{"StdinWrite", request, []any{execapi.StdinRequest{}}},
	{"SignalRequest", request, []any{execapi.SignalRequest{}}},
	{"ResizeRequest", request, []any{execapi.ResizeRequest{}}},
	{"MkdirRequest", request, []any{files.MkdirRequest{}}},
	{"RemoveRequest", request, []any{files.RemoveRequest{}}},
	{"MoveRequest", request, []any{files.MoveRequest{}}},
	{"TokenUpdate", request, []any{TokenUpdate{}}},
	{"AgentDefaults", request, []any{execapi.DefaultsRequest{}}},
	{"ExecResult", response, []any{execapi.ExecResult{}}},
	{"StreamEvent", response, []any{execapi.ChunkEvent{}, execapi.ExitEvent{}}},
	{"ProcessInfo", response, []any{proc.Info{}}},
	{"ProcessList", response, []any{execapi.ProcessList{}}},
	{"ProcessOutput", response, []any{execapi.OutputResult{}}},
	{"FileStat", response, []any{files.Stat{}}},
	{"FileList", response, []any{files.Listing{}}},
	{"TarResult", response, []any{files.TarResult{}}},
	{"ErrorResponse", response, []any{api.ErrorResponse{}}},
	{"ErrorBody", response, []any{api.ErrorBody{}}},
	{"AgentHealth", response, []any{health{}}},
}

// notFromAgent are Python fields the agent never sends or reads, and why.
var notFromAgent = map[string]string{
	"ErrorBody.details":   "the service's own errors may carry details; the agent's never do",
	"StreamEvent.code":    "error lines are reserved: the agent answers a failure before streaming with an HTTP error, and the service writes them when a relay breaks",
	"StreamEvent.message": "as StreamEvent.code",
}

// notInPython are Go fields the Python models do not declare yet, and why that is safe
// for now. Each is a change the Python side owes; remove the entry once the schema has it.
var notInPython = map[string]string{}

// notAgentWire are schemas in the file that no agent route carries.
var notAgentWire = map[string]string{}

type jsonSchema struct {
	Type                 any                   `json:"type"` // a name or a list of names
	AnyOf                []jsonSchema          `json:"anyOf"`
	Ref                  string                `json:"$ref"`
	Enum                 []any                 `json:"enum"`
	Const                any                   `json:"const"`
	Items                *jsonSchema           `json:"items"`
	Properties           map[string]jsonSchema `json:"properties"`
	Required             []string              `json:"required"`
	AdditionalProperties any                   `json:"additionalProperties"`
}

type kinds map[string]bool // JSON types; "*" is any

func jsonKind(v any) string {
	switch v.(type) {
	case string:
		return "string"
	case bool:
		return "boolean"
	case float64:
		return "number"
	case nil:
		return "null"
	}
	return "*"
}

// kindsOf lists the JSON types a property allows.
func kindsOf(s jsonSchema) kinds {
	k := kinds{}
	switch t := s.Type.(type) {
	case string:
		k[t] = true
	case []any:
		for _, x := range t {
			k[x.(string)] = true
		}
	}
	for _, a := range s.AnyOf {
		for x := range kindsOf(a) {
			k[x] = true
		}
	}
	if s.Ref != "" {
		k["object"] = true
	}
	for _, v := range s.Enum {
		k[jsonKind(v)] = true
	}
	if s.Const != nil {
		k[jsonKind(s.Const)] = true
	}
	if len(k) == 0 {
		k["*"] = true
	}
	return k
}

var rawMessage = reflect.TypeOf(json.RawMessage{})

// goKind is the JSON type a Go type reads and writes, and whether it may be null.
func goKind(t reflect.Type) (string, bool) {
	if t == rawMessage {
		return "*", true
	}
	switch t.Kind() {
	case reflect.Pointer:
		k, _ := goKind(t.Elem())
		return k, true
	case reflect.String:
		return "string", false
	case reflect.Bool:
		return "boolean", false
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return "integer", false
	case reflect.Float32, reflect.Float64:
		return "number", false
	case reflect.Map, reflect.Struct:
		return "object", false
	case reflect.Slice, reflect.Array:
		return "array", false
	}
	return "*", true
}

type goField struct {
	name      string
	typ       reflect.Type
	omitEmpty bool
}

// goFields lists a struct's JSON fields, those of embedded structs included.
func goFields(t reflect.Type) []goField {
	var out []goField
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		tag := f.Tag.Get("json")
		if f.Anonymous && tag == "" {
			out = append(out, goFields(f.Type)...)
			continue
		}
		name, opts, _ := strings.Cut(tag, ",")
		if name == "-" || !f.IsExported() {
			continue
		}
		if name == "" {
			name = f.Name
		}
		out = append(out, goField{name, f.Type, strings.Contains(opts, "omitempty")})
	}
	return out
}

func loadSchemas(t *testing.T) map[string]jsonSchema {
	t.Helper()
	raw, err := os.ReadFile("testdata/wire_schema.json")
	if err != nil {
		t.Fatal(err)
	}
	var schemas map[string]jsonSchema
	if err := json.Unmarshal(raw, &schemas); err != nil {
		t.Fatal(err)
	}
	// Models nested in another's $defs (ErrorBody in ErrorResponse) are checked as well.
	var nested map[string]struct {
		Defs map[string]jsonSchema `json:"$defs"`
	}
	if err := json.Unmarshal(raw, &nested); err != nil {
		t.Fatal(err)
	}
	for _, n := range nested {
		for name, def := range n.Defs {
			if _, ok := schemas[name]; !ok {
				schemas[name] = def
			}
		}
	}
	return schemas
}

func TestWireContract(t *testing.T) {
	for _, p := range contractProblems(loadSchemas(t)) {
		t.Error(p)
	}
}

// The checker itself: each kind of disagreement is caught.
func TestWireContractCatchesDisagreements(t *testing.T) {
	cases := []struct {
		name   string
		change func(s map[string]jsonSchema)
		want   string
	}{
		{"a Python field the agent does not know", func(s map[string]jsonSchema) {
			s["ExecRequest"].Properties["nice"] = jsonSchema{Type: "integer"}
		}, "ExecRequest.nice: Python field unknown"},
		{"a Go field Python does not know", func(s map[string]jsonSchema) {
			delete(s["ExecResult"].Properties, "signal")
		}, "ExecResult.signal: Go field"},
		{"a request type Go cannot read", func(s map[string]jsonSchema) {
			s["ResizeRequest"].Properties["rows"] = jsonSchema{Type: "string"}
		}, "ResizeRequest.rows: Python may send string"},
		{"a response type Python does not accept", func(s map[string]jsonSchema) {
			s["ExecResult"].Properties["duration_s"] = jsonSchema{Type: "integer"}
		}, "ExecResult.duration_s: the agent sends number"},
		{"null Python does not allow", func(s map[string]jsonSchema) {
			s["FileStat"].Properties["link_target"] = jsonSchema{Type: "string"}
		}, "FileStat.link_target: the agent may send null"},
		{"items of another model", func(s map[string]jsonSchema) {
			s["FileList"].Properties["entries"] = jsonSchema{Type: "array", Items: &jsonSchema{Ref: "#/$defs/ProcessInfo"}}
		}, "FileList.entries: items are ProcessInfo"},
		{"a stale exception", func(s map[string]jsonSchema) {
			delete(s["StreamEvent"].Properties, "code")
		}, "StreamEvent.code is listed as an exception"},
		{"a schema with no agent struct", func(s map[string]jsonSchema) {
			s["Mystery"] = jsonSchema{}
		}, "schemas with no agent struct: [Mystery]"},
		{"a missing schema", func(s map[string]jsonSchema) {
			delete(s, "TarResult")
		}, "TarResult: not in testdata/wire_schema.json"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s := loadSchemas(t)
			c.change(s)
			got := contractProblems(s)
			for _, p := range got {
				if strings.Contains(p, c.want) {
					return
				}
			}
			t.Fatalf("want a problem with %q, got %q", c.want, got)
		})
	}
}

// contractProblems lists every disagreement between the schemas and the Go structs.
func contractProblems(schemas map[string]jsonSchema) []string {
	var problems []string
	errorf := func(format string, args ...any) { problems = append(problems, fmt.Sprintf(format, args...)) }
	byType := map[reflect.Type]string{} // Go struct -> the schema it carries
	for _, p := range wirePairs {
		for _, v := range p.goType {
			byType[reflect.TypeOf(v)] = p.schema
		}
	}
	used := map[string]bool{}
	for _, p := range wirePairs {
		s, ok := schemas[p.schema]
		if !ok {
			errorf("%s: not in testdata/wire_schema.json", p.schema)
			continue
		}
		seen := map[string]bool{}
		for _, v := range p.goType {
			for _, f := range goFields(reflect.TypeOf(v)) {
				seen[f.name] = true
				key := p.schema + "." + f.name
				prop, ok := s.Properties[f.name]
				if !ok {
					if _, listed := notInPython[key]; listed {
						used[key] = true
					} else {
						errorf("%s: Go field %s (%s) is not in the Python model", key, f.name, reflect.TypeOf(v))
					}
					continue
				}
				problems = append(problems, checkField(key, p.dir, f, prop, byType)...)
			}
		}
		for name := range s.Properties {
			key := p.schema + "." + name
			if seen[name] {
				continue
			}
			if _, listed := notFromAgent[key]; listed {
				used[key] = true
				if p.dir == response && contains(s.Required, name) {
					errorf("%s: required in Python but never sent by the agent", key)
				}
				continue
			}
			errorf("%s: Python field unknown to the agent's %s", key, typeNames(p.goType))
		}
	}
	for _, list := range []map[string]string{notFromAgent, notInPython} {
		for key := range list {
			if !used[key] {
				errorf("%s is listed as an exception but the schema and Go now agree: remove it from wire_test.go", key)
			}
		}
	}
	paired := map[string]bool{}
	for _, p := range wirePairs {
		paired[p.schema] = true
	}
	var extra []string
	for name := range schemas {
		if _, skip := notAgentWire[name]; !paired[name] && !skip {
			extra = append(extra, name)
		}
	}
	sort.Strings(extra)
	if len(extra) > 0 {
		errorf("schemas with no agent struct: %v (pair them in wirePairs or list them in notAgentWire)", extra)
	}
	sort.Strings(problems)
	return problems
}

// checkField compares one field's Go type with its Python schema, in the direction
// the data flows.
func checkField(key string, dir direction, f goField, prop jsonSchema, byType map[reflect.Type]string) []string {
	var problems []string
	errorf := func(format string, args ...any) { problems = append(problems, fmt.Sprintf(format, args...)) }
	gk, nullable := goKind(f.typ)
	py := kindsOf(prop)
	if py["*"] || gk == "*" {
		return nil
	}
	switch dir {
	case request: // every non-null type Python may send must decode into the Go field (null always does)
		for k := range py {
			if k != "null" && k != gk && !(gk == "number" && k == "integer") {
				errorf("%s: Python may send %s, the agent reads %s (%s)", key, k, gk, f.typ)
			}
		}
	case response: // Python must accept what Go writes
		if !py[gk] && !(gk == "integer" && py["number"]) {
			errorf("%s: the agent sends %s (%s), Python expects %v", key, gk, f.typ, keys(py))
		}
		if nullable && !py["null"] {
			errorf("%s: the agent may send null (%s), Python does not allow it", key, f.typ)
		}
		if f.omitEmpty {
			errorf("%s: omitempty hides the field from Python's defaults and requirements", key)
		}
	}
	if gk == "array" && prop.Items != nil && prop.Items.Ref != "" {
		elem := f.typ
		for elem.Kind() == reflect.Pointer || elem.Kind() == reflect.Slice {
			elem = elem.Elem()
		}
		want := prop.Items.Ref[strings.LastIndex(prop.Items.Ref, "/")+1:]
		if byType[elem] != want {
			errorf("%s: items are %s in Python, %s in Go (which carries %q)", key, want, elem, byType[elem])
		}
	}
	return problems
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

func keys(k kinds) []string {
	out := make([]string, 0, len(k))
	for x := range k {
		out = append(out, x)
	}
	sort.Strings(out)
	return out
}

func typeNames(vs []any) string {
	names := make([]string, len(vs))
	for i, v := range vs {
		names[i] = reflect.TypeOf(v).String()
	}
	return strings.Join(names, "+")
}
