// Validates the Prometheus Operator resources in docs/kubernetes against the
// operator's CRD schemas (npm @kubernetes-models/prometheus-operator, whose
// models are generated from them) and writes the PrometheusRule's groups as
// a plain rules file for promtool. Usage: node check.mjs DOCS_DIR RULES_OUT
import { readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { parseAllDocuments, stringify } from "yaml";
import { ServiceMonitor, PrometheusRule } from "@kubernetes-models/prometheus-operator/monitoring.coreos.com/v1";

const [dir, rulesOut] = process.argv.slice(2);
const models = { ServiceMonitor, PrometheusRule };
const seen = {};
for (const file of ["servicemonitor.yaml", "prometheusrule.yaml"]) {
  for (const doc of parseAllDocuments(readFileSync(join(dir, file), "utf8"))) {
    if (doc.errors.length) throw new Error(`${file}: ${doc.errors[0].message}`);
    const obj = doc.toJS();
    const Model = models[obj.kind];
    if (!Model) throw new Error(`${file}: unexpected kind ${obj.kind}`);
    try {
      new Model(obj).validate();
    } catch (e) {
      throw new Error(`${file}: ${obj.kind}/${obj.metadata?.name}: ${e.message}`);
    }
    seen[obj.kind] = obj;
    console.log(`${file}: ${obj.kind}/${obj.metadata.name} valid`);
  }
}
for (const kind of Object.keys(models)) {
  if (!seen[kind]) throw new Error(`no ${kind} in ${dir}`);
}
writeFileSync(rulesOut, stringify({ groups: seen.PrometheusRule.spec.groups }));
