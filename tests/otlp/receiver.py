"""An OTLP/HTTP profiles receiver for pgbelow's tests, decoding with the
official OpenTelemetry protobuf definitions (PyPI opentelemetry-proto,
installed by scripts/setup into tests/otlp/pylib).

  receiver.py serve PORT OUTDIR   one JSON summary per POST into OUTDIR
  receiver.py decode FILE         the summary of one request on stdout
"""
import json
import os
import sys
from http.server import BaseHTTPRequestHandler, HTTPServer

from opentelemetry.proto.collector.profiles.v1development import profiles_service_pb2

PATH = "/v1development/profiles"


def any_value(v):
    kind = v.WhichOneof("value")
    return getattr(v, kind) if kind else None


def summary(body):
    req = profiles_service_pb2.ExportProfilesServiceRequest()
    req.ParseFromString(body)
    d = req.dictionary
    st = list(d.string_table)
    out = {"resource_profiles": []}
    for rp in req.resource_profiles:
        r = {
            "resource": {kv.key: any_value(kv.value) for kv in rp.resource.attributes},
            "scopes": [],
        }
        for sp in rp.scope_profiles:
            s = {"scope": sp.scope.name, "profiles": []}
            for p in sp.profiles:
                functions = {}
                attr_keys = set()
                attrs = {}
                depth = 0
                for smp in p.samples:
                    stack = d.stack_table[smp.stack_index]
                    depth = max(depth, len(stack.location_indices))
                    for i, li in enumerate(stack.location_indices):
                        loc = d.location_table[li]
                        for line in loc.lines:
                            name = st[d.function_table[line.function_index].name_strindex]
                            functions[name] = functions.get(name, 0) + (smp.values[0] if i == 0 else 0)
                    for ai in smp.attribute_indices:
                        a = d.attribute_table[ai]
                        k = st[a.key_strindex]
                        attr_keys.add(k)
                        attrs.setdefault(k, set()).add(str(any_value(a.value)))
                s["profiles"].append({
                    "sample_type": [st[p.sample_type.type_strindex], st[p.sample_type.unit_strindex]],
                    "period_type": [st[p.period_type.type_strindex], st[p.period_type.unit_strindex]],
                    "period": p.period,
                    "samples": len(p.samples),
                    "total": sum(x.values[0] for x in p.samples),
                    "leaf_samples_by_function": functions,
                    "functions": sorted(functions),
                    "attribute_keys": sorted(attr_keys),
                    "roles": sorted(attrs.get("role", [])),
                    "query_ids": sorted(attrs.get("query_id", [])),
                    "applications": sorted(attrs.get("application_name", [])),
                    "max_depth": depth,
                    "profile_id_len": len(p.profile_id),
                    "time_unix_nano": p.time_unix_nano,
                    "duration_nano": p.duration_nano,
                })
            r["scopes"].append(s)
        out["resource_profiles"].append(r)
    return out


class Handler(BaseHTTPRequestHandler):
    def do_POST(self):
        n = int(self.headers.get("Content-Length", "0"))
        body = self.rfile.read(n)
        if self.path != PATH or self.headers.get("Content-Type") != "application/x-protobuf":
            self.send_response(404)
            self.end_headers()
            return
        try:
            s = summary(body)
        except Exception as e:  # a body that does not decode: 400, as a collector would
            self.send_response(400)
            self.end_headers()
            self.wfile.write(str(e).encode())
            return
        seq = len(os.listdir(self.server.outdir))
        tmp = os.path.join(self.server.outdir, ".%d.tmp" % seq)
        with open(tmp, "w") as f:
            json.dump(s, f)
        os.rename(tmp, os.path.join(self.server.outdir, "%04d.json" % seq))
        resp = profiles_service_pb2.ExportProfilesServiceResponse().SerializeToString()
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", str(len(resp)))
        self.end_headers()
        self.wfile.write(resp)

    def log_message(self, *args):
        pass


if __name__ == "__main__":
    if sys.argv[1] == "decode":
        with open(sys.argv[2], "rb") as f:
            print(json.dumps(summary(f.read())))
    else:
        srv = HTTPServer(("127.0.0.1", int(sys.argv[2])), Handler)
        srv.outdir = sys.argv[3]
        srv.serve_forever()
