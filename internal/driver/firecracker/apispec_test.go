package firecracker

import (
	"encoding/json"
	"fmt"
	"math"
	"slices"
	"sort"
	"strings"
	"testing"
)

// The facts of Firecracker's published API description, the swagger file
// src/firecracker/swagger/firecracker.yaml of the Firecracker repository,
// for every path and definition the driver uses. They are the same in
// v1.8.0 (minVersion) and v1.10.1 (deploy/provision.sh's pinned release):
// between the two the file changed only in its version line, a commented
// gdb_socket_path and FullVmConfiguration's cpu-config and entropy, which
// the driver does not send. The file is not copied here; its facts are
// (Apache-2.0 permits a copy, but parsing it would need a YAML library in
// the module for a test's sake).
//
// To re-check them against a new release: for each definition below,
// compare "required" and "properties" (name, type, enum, minimum, maximum)
// with the release's firecracker.yaml.

// apiType is the schema of one property or definition.
type apiType struct {
	kind     string   // "string", "boolean", "integer", "object" (ref), "array" (of ref), "unchecked" (a ref these facts leave out)
	ref      string   // definition of an object, or of an array's items
	enum     []string // allowed strings
	min, max *float64 // bounds of an integer
}

// apiDef is one definition: its properties and which are required.
type apiDef struct {
	required []string
	props    map[string]apiType
}

func fnum(v float64) *float64 { return &v }

var (
	str     = apiType{kind: "string"}
	boolean = apiType{kind: "boolean"}
	integer = apiType{kind: "integer"}
)

func ref(def string) apiType     { return apiType{kind: "object", ref: def} }
func enum(v ...string) apiType   { return apiType{kind: "string", enum: v} }
func arrayOf(def string) apiType { return apiType{kind: "array", ref: def} }

// unchecked is a property whose definition these facts do not hold: the
// driver must not send it.
var unchecked = apiType{kind: "unchecked"}

// swaggerDefs are the definitions, as in the swagger file.
var swaggerDefs = map[string]apiDef{
	"Logger": {props: map[string]apiType{
		"level":           enum("Error", "Warning", "Info", "Debug", "Trace", "Off"),
		"log_path":        str,
		"show_level":      boolean,
		"show_log_origin": boolean,
		"module":          str,
	}},
	"Metrics": {required: []string{"metrics_path"}, props: map[string]apiType{
		"metrics_path": str,
	}},
	"MachineConfiguration": {required: []string{"mem_size_mib", "vcpu_count"}, props: map[string]apiType{
		"cpu_template":      unchecked,
		"smt":               boolean,
		"mem_size_mib":      integer,
		"track_dirty_pages": boolean,
		"vcpu_count":        {kind: "integer", min: fnum(1), max: fnum(32)},
		"huge_pages":        enum("None", "2M"),
	}},
	"BootSource": {required: []string{"kernel_image_path"}, props: map[string]apiType{
		"boot_args":         str,
		"initrd_path":       str,
		"kernel_image_path": str,
	}},
	"Drive": {required: []string{"drive_id", "is_root_device"}, props: map[string]apiType{
		"drive_id":       str,
		"partuuid":       str,
		"is_root_device": boolean,
		"cache_type":     enum("Unsafe", "Writeback"),
		"is_read_only":   boolean,
		"path_on_host":   str,
		"rate_limiter":   ref("RateLimiter"),
		"io_engine":      enum("Sync", "Async"),
		"socket":         str,
	}},
	"RateLimiter": {props: map[string]apiType{
		"bandwidth": ref("TokenBucket"),
		"ops":       ref("TokenBucket"),
	}},
	"TokenBucket": {required: []string{"refill_time", "size"}, props: map[string]apiType{
		"one_time_burst": {kind: "integer", min: fnum(0)},
		"refill_time":    {kind: "integer", min: fnum(0)},
		"size":           {kind: "integer", min: fnum(0)},
	}},
	"NetworkInterface": {required: []string{"host_dev_name", "iface_id"}, props: map[string]apiType{
		"guest_mac":       str,
		"host_dev_name":   str,
		"iface_id":        str,
		"rx_rate_limiter": ref("RateLimiter"),
		"tx_rate_limiter": ref("RateLimiter"),
	}},
	"Vsock": {required: []string{"guest_cid", "uds_path"}, props: map[string]apiType{
		"guest_cid": {kind: "integer", min: fnum(3)},
		"uds_path":  str,
		"vsock_id":  str,
	}},
	"InstanceActionInfo": {required: []string{"action_type"}, props: map[string]apiType{
		"action_type": enum("FlushMetrics", "InstanceStart", "SendCtrlAltDel"),
	}},
	"InstanceInfo": {required: []string{"app_name", "id", "state", "vmm_version"}, props: map[string]apiType{
		"app_name":    str,
		"id":          str,
		"state":       enum("Not started", "Running", "Paused"),
		"vmm_version": str,
	}},
	"Vm": {required: []string{"state"}, props: map[string]apiType{
		"state": enum("Paused", "Resumed"),
	}},
	"SnapshotCreateParams": {required: []string{"mem_file_path", "snapshot_path"}, props: map[string]apiType{
		"mem_file_path": str,
		"snapshot_path": str,
		"snapshot_type": enum("Full", "Diff"),
	}},
	// "Exactly one of the two mem_* fields must be present": the fake
	// checks that rule, which the schema cannot say.
	"SnapshotLoadParams": {required: []string{"snapshot_path"}, props: map[string]apiType{
		"enable_diff_snapshots": boolean,
		"mem_file_path":         str,
		"mem_backend":           ref("MemoryBackend"),
		"snapshot_path":         str,
		"resume_vm":             boolean,
	}},
	"MemoryBackend": {required: []string{"backend_type", "backend_path"}, props: map[string]apiType{
		"backend_type": enum("File", "Uffd"),
		"backend_path": str,
	}},
	// The --config-file format. The swagger file marks nothing required,
	// but Firecracker's parser (VmmConfig in src/vmm/src/resources.rs)
	// requires "drives" and "boot-source".
	"FullVmConfiguration": {required: []string{"boot-source", "drives"}, props: map[string]apiType{
		"balloon":            unchecked,
		"drives":             arrayOf("Drive"),
		"boot-source":        ref("BootSource"),
		"cpu-config":         unchecked,
		"logger":             ref("Logger"),
		"machine-config":     ref("MachineConfiguration"),
		"metrics":            ref("Metrics"),
		"mmds-config":        unchecked,
		"network-interfaces": arrayOf("NetworkInterface"),
		"vsock":              ref("Vsock"),
		"entropy":            unchecked,
	}},
}

// apiOp is one operation of the swagger file's paths.
type apiOp struct {
	body      string // definition of the body, "" for none
	ok        int    // success status
	reply     string // definition of the success reply, "" for none
	pathParam string // a {param} in the path that must equal the body's field of the same name
}

// swaggerPaths are the operations the driver uses, by "METHOD /path" with
// the swagger file's {param} placeholders. Every one answers errors (400
// and default) with the Error definition, {"fault_message": "..."}.
var swaggerPaths = map[string]apiOp{
	"GET /":                              {ok: 200, reply: "InstanceInfo"},
	"PUT /actions":                       {body: "InstanceActionInfo", ok: 204},
	"PUT /boot-source":                   {body: "BootSource", ok: 204},
	"PUT /drives/{drive_id}":             {body: "Drive", ok: 204, pathParam: "drive_id"},
	"PUT /logger":                        {body: "Logger", ok: 204},
	"PUT /machine-config":                {body: "MachineConfiguration", ok: 204},
	"PUT /metrics":                       {body: "Metrics", ok: 204},
	"PUT /network-interfaces/{iface_id}": {body: "NetworkInterface", ok: 204, pathParam: "iface_id"},
	"PUT /vsock":                         {body: "Vsock", ok: 204},
	"PATCH /vm":                          {body: "Vm", ok: 204},
	"PUT /snapshot/create":               {body: "SnapshotCreateParams", ok: 204},
	"PUT /snapshot/load":                 {body: "SnapshotLoadParams", ok: 204},
}

// lookupOp finds the operation of method and a concrete path, and the
// value of its path parameter.
func lookupOp(method, path string) (op apiOp, param string, ok bool) {
	if op, ok := swaggerPaths[method+" "+path]; ok {
		return op, "", true
	}
	for k, op := range swaggerPaths {
		m, tmpl, _ := strings.Cut(k, " ")
		prefix, _, isParam := strings.Cut(tmpl, "{")
		if !isParam || m != method || !strings.HasPrefix(path, prefix) {
			continue
		}
		if v := strings.TrimPrefix(path, prefix); v != "" && !strings.Contains(v, "/") {
			return op, v, true
		}
	}
	return apiOp{}, "", false
}

// checkRequest returns what is wrong with a request by the swagger facts:
// an unknown path or method, a missing, unknown or ill-typed field, a path
// parameter that differs from the body's. Firecracker answers each of
// these with 400.
func checkRequest(method, path string, body []byte) []string {
	op, param, ok := lookupOp(method, path)
	if !ok {
		return []string{fmt.Sprintf("%s %s is not an operation of the API description", method, path)}
	}
	if op.body == "" {
		if len(body) > 0 {
			return []string{fmt.Sprintf("%s %s takes no body", method, path)}
		}
		return nil
	}
	var v any
	if err := json.Unmarshal(body, &v); err != nil {
		return []string{fmt.Sprintf("%s %s: body is not JSON: %v", method, path, err)}
	}
	probs := checkValue(op.body, ref(op.body), v)
	if op.pathParam != "" {
		if m, _ := v.(map[string]any); m != nil && m[op.pathParam] != param {
			probs = append(probs, fmt.Sprintf("path %s %q differs from the body's %q", op.pathParam, param, m[op.pathParam]))
		}
	}
	return probs
}

// checkValue checks v against t; where names the value in messages.
func checkValue(where string, t apiType, v any) []string {
	switch t.kind {
	case "unchecked":
		return []string{where + ": sent, but these facts do not hold its definition (add them from the swagger file)"}
	case "string":
		s, ok := v.(string)
		if !ok {
			return []string{fmt.Sprintf("%s: %v is not a string", where, v)}
		}
		if len(t.enum) > 0 && !slices.Contains(t.enum, s) {
			return []string{fmt.Sprintf("%s: %q is not one of %q", where, s, t.enum)}
		}
	case "boolean":
		if _, ok := v.(bool); !ok {
			return []string{fmt.Sprintf("%s: %v is not a boolean", where, v)}
		}
	case "integer":
		f, ok := v.(float64)
		if !ok || f != math.Trunc(f) {
			return []string{fmt.Sprintf("%s: %v is not an integer", where, v)}
		}
		if (t.min != nil && f < *t.min) || (t.max != nil && f > *t.max) {
			return []string{fmt.Sprintf("%s: %v is out of range", where, v)}
		}
	case "array":
		a, ok := v.([]any)
		if !ok {
			return []string{fmt.Sprintf("%s: %v is not an array", where, v)}
		}
		var probs []string
		for i, e := range a {
			probs = append(probs, checkValue(fmt.Sprintf("%s[%d]", where, i), ref(t.ref), e)...)
		}
		return probs
	case "object":
		def, known := swaggerDefs[t.ref]
		if !known {
			return []string{where + ": no facts for definition " + t.ref}
		}
		m, ok := v.(map[string]any)
		if !ok {
			return []string{fmt.Sprintf("%s: %v is not an object (%s)", where, v, t.ref)}
		}
		var probs []string
		for _, r := range def.required {
			if _, ok := m[r]; !ok {
				probs = append(probs, fmt.Sprintf("%s: required field %s missing", where, r))
			}
		}
		keys := make([]string, 0, len(m))
		for k := range m {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			pt, ok := def.props[k]
			if !ok {
				probs = append(probs, fmt.Sprintf("%s: unknown field %s (%s has no such property; Firecracker rejects unknown fields)", where, k, t.ref))
				continue
			}
			probs = append(probs, checkValue(where+"."+k, pt, m[k])...)
		}
		return probs
	default:
		return []string{where + ": unknown kind " + t.kind}
	}
	return nil
}

// TestCheckRequest shows that the swagger check catches what Firecracker
// refuses, so the conversation tests that rely on it can fail.
func TestCheckRequest(t *testing.T) {
	for _, tc := range []struct {
		name, method, path, body string
		want                     string // substring of a problem; "" = valid
	}{
		{"valid drive", "PUT", "/drives/rootfs", `{"drive_id":"rootfs","path_on_host":"/r","is_root_device":true,"is_read_only":false}`, ""},
		{"drive id differs from path", "PUT", "/drives/rootfs", `{"drive_id":"root","path_on_host":"/r","is_root_device":true}`, "differs"},
		{"required field missing", "PUT", "/drives/x", `{"drive_id":"x","path_on_host":"/r"}`, "is_root_device missing"},
		{"unknown field", "PUT", "/machine-config", `{"vcpu_count":1,"mem_size_mib":5,"ht_enabled":false}`, "unknown field ht_enabled"},
		{"bound", "PUT", "/machine-config", `{"vcpu_count":33,"mem_size_mib":5}`, "out of range"},
		{"not an integer", "PUT", "/machine-config", `{"vcpu_count":1.5,"mem_size_mib":5}`, "not an integer"},
		{"enum", "PUT", "/actions", `{"action_type":"Reboot"}`, "not one of"},
		{"nested", "PUT", "/network-interfaces/eth0", `{"iface_id":"eth0","host_dev_name":"t","rx_rate_limiter":{"ops":{"size":-1,"refill_time":1}}}`, "rx_rate_limiter.ops.size"},
		{"string type", "PUT", "/vsock", `{"guest_cid":3,"uds_path":7}`, "not a string"},
		{"cid minimum", "PUT", "/vsock", `{"guest_cid":2,"uds_path":"/v"}`, "out of range"},
		{"unknown path", "PUT", "/drive/rootfs", `{}`, "not an operation"},
		{"GET with a body", "GET", "/", `{}`, "takes no body"},
		{"vm state", "PATCH", "/vm", `{"state":"Running"}`, "not one of"},
		{"vm with PUT", "PUT", "/vm", `{"state":"Paused"}`, "not an operation"},
		{"snapshot without memory", "PUT", "/snapshot/create", `{"snapshot_path":"/s"}`, "mem_file_path missing"},
		{"memory backend type", "PUT", "/snapshot/load", `{"snapshot_path":"/s","mem_backend":{"backend_type":"file","backend_path":"/m"}}`, "not one of"},
		{"valid load", "PUT", "/snapshot/load", `{"snapshot_path":"/s","mem_backend":{"backend_type":"File","backend_path":"/m"},"resume_vm":false}`, ""},
		{"valid get", "GET", "/", ``, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			probs := checkRequest(tc.method, tc.path, []byte(tc.body))
			if tc.want == "" {
				if len(probs) > 0 {
					t.Errorf("valid request refused: %q", probs)
				}
				return
			}
			if !strings.Contains(strings.Join(probs, "\n"), tc.want) {
				t.Errorf("problems %q, want one saying %q", probs, tc.want)
			}
		})
	}
}

// TestProbeConfigMatchesAPI: the probe boot's --config-file is a valid
// FullVmConfiguration.
func TestProbeConfigMatchesAPI(t *testing.T) {
	b, err := json.Marshal(probeVMConfig("/vmlinux", "/initrd"))
	if err != nil {
		t.Fatal(err)
	}
	var v any
	json.Unmarshal(b, &v)
	if probs := checkValue("config-file", ref("FullVmConfiguration"), v); len(probs) > 0 {
		t.Errorf("probe config %s: %q", b, probs)
	}
}
