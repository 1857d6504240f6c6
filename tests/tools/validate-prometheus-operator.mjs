// Validates Prometheus Operator objects against the schemas generated from the operator's CRDs
// (@kubernetes-models/prometheus-operator). Input on stdin: a JSON array of objects. Output on stdout: a JSON
// array with, per object, null (valid) or the validator's message. Used by tests/prometheus_operator_schema.py.
import * as v1 from "@kubernetes-models/prometheus-operator/monitoring.coreos.com/v1";

const chunks = [];
for await (const chunk of process.stdin) chunks.push(chunk);
const objects = JSON.parse(Buffer.concat(chunks).toString("utf8"));
const results = objects.map((obj) => {
  if (obj.apiVersion !== "monitoring.coreos.com/v1" || !(obj.kind in v1)) {
    return `unsupported apiVersion/kind ${obj.apiVersion}/${obj.kind}`;
  }
  try {
    new v1[obj.kind](obj).validate();
    return null;
  } catch (err) {
    return String(err.message);
  }
});
process.stdout.write(JSON.stringify(results));
