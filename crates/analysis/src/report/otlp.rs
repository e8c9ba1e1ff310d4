//! The on-CPU profile of a recording as an OpenTelemetry profiles export
//! (OTLP, `profiles/v1development`): one `ExportProfilesServiceRequest`,
//! the body `POST /v1development/profiles` takes (Grafana Pyroscope,
//! Alloy and the OpenTelemetry Collector read it). Encoded from the same
//! model as the pprof export ([`super::view::profile`]); the messages are
//! the `opentelemetry-proto` crate's.
//!
//! The resource says where the profile comes from (`host.name`,
//! `service.name` = postgresql, `postgresql.data_directory`,
//! `postgresql.cluster_name`, `postgresql.version`, where the recording
//! knows them); each sample carries `role`, `pid`, `node` and `query_id`
//! attributes as the pprof samples carry labels. One profile per sample
//! type: `samples/count` on the CPU, then `off_cpu_d`, `off_cpu_s` and
//! `runq` in nanoseconds where the offcpu collector ran.
use std::collections::HashMap;

use opentelemetry_proto::tonic::collector::profiles::v1development::ExportProfilesServiceRequest;
use opentelemetry_proto::tonic::common::v1::{any_value, AnyValue, InstrumentationScope, KeyValue};
use opentelemetry_proto::tonic::profiles::v1development::{
    Function, KeyValueAndUnit, Line, Location, Mapping, Profile, ProfilesDictionary,
    ResourceProfiles, Sample, ScopeProfiles, Stack, ValueType,
};
use opentelemetry_proto::tonic::resource::v1::Resource;
use prost::Message;

use super::view::profile::{split_kernel, Frame, ProfileModel, SampleKind};

/// Where OTLP/HTTP takes profiles, below the endpoint's base URL.
pub const HTTP_PATH: &str = "/v1development/profiles";

/// The encoded request, or an error naming why the recording has no profile.
pub fn export(m: &ProfileModel) -> Vec<u8> {
    build(m).encode_to_vec()
}

/// Index 0 of every dictionary table is the empty entry, as the protocol
/// asks; the rest deduplicated.
#[derive(Default)]
struct Dict {
    d: ProfilesDictionary,
    strings: HashMap<String, i32>,
    mappings: HashMap<String, i32>,
    functions: HashMap<(String, Option<String>), i32>,
    locations: HashMap<(i32, i32), i32>,
    stacks: HashMap<Vec<i32>, i32>,
    attributes: HashMap<(String, String), i32>,
}

impl Dict {
    fn new() -> Dict {
        let mut d = Dict::default();
        d.s("");
        d.d.mapping_table.push(Mapping::default());
        d.d.location_table.push(Location::default());
        d.d.function_table.push(Function::default());
        d.d.link_table.push(Default::default());
        d.d.attribute_table.push(KeyValueAndUnit::default());
        d.d.stack_table.push(Stack::default());
        d
    }

    fn s(&mut self, v: &str) -> i32 {
        if let Some(&i) = self.strings.get(v) {
            return i;
        }
        let i = self.d.string_table.len() as i32;
        self.d.string_table.push(v.to_string());
        self.strings.insert(v.to_string(), i);
        i
    }

    fn mapping(&mut self, path: &str) -> i32 {
        if let Some(&i) = self.mappings.get(path) {
            return i;
        }
        let i = self.d.mapping_table.len() as i32;
        let filename_strindex = self.s(path);
        self.d.mapping_table.push(Mapping {
            filename_strindex,
            ..Default::default()
        });
        self.mappings.insert(path.to_string(), i);
        i
    }

    fn location(&mut self, f: &Frame) -> i32 {
        let (name, module) = split_kernel(f);
        let key = (name.to_string(), module.clone());
        let function_index = match self.functions.get(&key) {
            Some(&i) => i,
            None => {
                let i = self.d.function_table.len() as i32;
                let n = self.s(name);
                let filename_strindex = module.as_deref().map_or(0, |m| self.s(m));
                self.d.function_table.push(Function {
                    name_strindex: n,
                    system_name_strindex: n,
                    filename_strindex,
                    start_line: 0,
                });
                self.functions.insert(key, i);
                i
            }
        };
        let mapping_index = module.as_deref().map_or(0, |m| self.mapping(m));
        if let Some(&i) = self.locations.get(&(function_index, mapping_index)) {
            return i;
        }
        let i = self.d.location_table.len() as i32;
        self.d.location_table.push(Location {
            mapping_index,
            lines: vec![Line {
                function_index,
                ..Default::default()
            }],
            ..Default::default()
        });
        self.locations.insert((function_index, mapping_index), i);
        i
    }

    /// The stack, leaf first as in pprof (the model's frames are root first).
    fn stack(&mut self, frames: &[Frame]) -> i32 {
        let location_indices: Vec<i32> = frames.iter().rev().map(|f| self.location(f)).collect();
        if let Some(&i) = self.stacks.get(&location_indices) {
            return i;
        }
        let i = self.d.stack_table.len() as i32;
        self.d.stack_table.push(Stack {
            location_indices: location_indices.clone(),
        });
        self.stacks.insert(location_indices, i);
        i
    }

    fn attribute(&mut self, key: &str, value: &str) -> i32 {
        let k = (key.to_string(), value.to_string());
        if let Some(&i) = self.attributes.get(&k) {
            return i;
        }
        let i = self.d.attribute_table.len() as i32;
        let key_strindex = self.s(key);
        self.d.attribute_table.push(KeyValueAndUnit {
            key_strindex,
            value: Some(string_value(value)),
            unit_strindex: 0,
        });
        self.attributes.insert(k, i);
        i
    }
}

fn string_value(v: &str) -> AnyValue {
    AnyValue {
        value: Some(any_value::Value::StringValue(v.to_string())),
    }
}

/// A profile id that is the same for the same recording: 16 bytes, not all 0.
fn profile_id(m: &ProfileModel, nth: u8) -> Vec<u8> {
    use std::hash::{Hash, Hasher};
    let mut out = Vec::with_capacity(16);
    for salt in [0u8, 1] {
        let mut h = std::collections::hash_map::DefaultHasher::new();
        // The on-CPU profile (0) keeps the id it always had.
        if nth == 0 {
            (salt, m.start_unix_ns, &m.source).hash(&mut h);
        } else {
            (salt, m.start_unix_ns, &m.source, nth).hash(&mut h);
        }
        out.extend_from_slice(&h.finish().to_le_bytes());
    }
    if out.iter().all(|b| *b == 0) {
        out[0] = 1;
    }
    out
}

/// The request message (not yet encoded).
pub fn build(m: &ProfileModel) -> ExportProfilesServiceRequest {
    let mut d = Dict::new();
    let period_type = ValueType {
        type_strindex: d.s("cpu"),
        unit_strindex: d.s("nanoseconds"),
    };
    // One profile per sample type (a profile has one): the on-CPU samples,
    // then the off-CPU nanoseconds of each state the offcpu collector saw.
    let mut kinds = vec![(SampleKind::OnCpu, "samples", "count", 1i64)];
    for (state, name) in m.off_cpu_states() {
        kinds.push((SampleKind::OffCpu(state), name, "nanoseconds", 1000));
    }
    let mut profiles = Vec::new();
    for (n, (kind, name, unit, scale)) in kinds.into_iter().enumerate() {
        let sample_type = ValueType {
            type_strindex: d.s(name),
            unit_strindex: d.s(unit),
        };
        let samples = m
            .samples
            .iter()
            .filter(|s| s.kind == kind)
            .map(|s| Sample {
                stack_index: d.stack(&s.frames),
                attribute_indices: s.labels.iter().map(|(k, v)| d.attribute(k, v)).collect(),
                link_index: 0,
                values: vec![s.count as i64 * scale],
                timestamps_unix_nano: Vec::new(),
            })
            .collect();
        profiles.push(Profile {
            sample_type: Some(sample_type),
            samples,
            time_unix_nano: m.start_unix_ns.max(0) as u64,
            duration_nano: m.duration_ns.max(0) as u64,
            period_type: Some(period_type),
            period: m.period_ns,
            profile_id: profile_id(m, n as u8),
            ..Default::default()
        });
    }
    let resource = Resource {
        attributes: m
            .resource
            .iter()
            .map(|(k, v)| KeyValue {
                key: k.to_string(),
                value: Some(string_value(v)),
                ..Default::default()
            })
            .collect(),
        ..Default::default()
    };
    ExportProfilesServiceRequest {
        resource_profiles: vec![ResourceProfiles {
            resource: Some(resource),
            scope_profiles: vec![ScopeProfiles {
                scope: Some(InstrumentationScope {
                    name: "pgbelow".into(),
                    version: env!("CARGO_PKG_VERSION").into(),
                    ..Default::default()
                }),
                profiles,
                schema_url: String::new(),
            }],
            schema_url: String::new(),
        }],
        dictionary: Some(d.d),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A real recording's profile: every model sample once, the counts and
    /// the function names as the recording has them, leaf first.
    #[test]
    fn a_recorded_profile_as_an_otlp_request() {
        let ev = crate::evidence::fixture("pg13-select-only-timeout-all");
        let m = crate::report::view::profile::model(&ev).unwrap();
        let r = build(&m);
        let d = r.dictionary.as_ref().unwrap();
        let p = &r.resource_profiles[0].scope_profiles[0].profiles[0];
        let on = m.samples.iter().filter(|s| s.kind == SampleKind::OnCpu);
        assert_eq!(p.samples.len(), on.count());
        let total: i64 = p.samples.iter().map(|s| s.values[0]).sum();
        let want: u64 = m
            .samples
            .iter()
            .filter(|s| s.kind == SampleKind::OnCpu)
            .map(|s| s.count)
            .sum();
        assert_eq!(total as u64, want);
        assert!(total > 100, "{total}");
        // The first sample's leaf is the model's last frame.
        let s0 = &p.samples[0];
        let leaf = d.stack_table[s0.stack_index as usize].location_indices[0];
        let f = d.location_table[leaf as usize].lines[0].function_index;
        let name = &d.string_table[d.function_table[f as usize].name_strindex as usize];
        let (want_leaf, _) = split_kernel(m.samples[0].frames.last().unwrap());
        assert_eq!(name, want_leaf);
        // Index 0 of each table is the empty entry.
        assert_eq!(d.string_table[0], "");
        assert_eq!(d.stack_table[0], Stack::default());
        let keys: Vec<&str> = s0
            .attribute_indices
            .iter()
            .map(|i| d.string_table[d.attribute_table[*i as usize].key_strindex as usize].as_str())
            .collect();
        // A recording of role-level stacks (no per-process ones): role and node.
        assert_eq!(keys, ["role", "node"]);
        assert_eq!(p.profile_id.len(), 16);
        let res = r.resource_profiles[0].resource.as_ref().unwrap();
        assert!(res.attributes.iter().any(|kv| kv.key == "service.name"));
        // Encodes and decodes to the same message.
        let bytes = r.encode_to_vec();
        assert_eq!(ExportProfilesServiceRequest::decode(&bytes[..]).unwrap(), r);
    }
}
