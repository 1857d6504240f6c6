// Validates Gateway API objects against the schemas generated from the upstream CRDs
// (@kubernetes-models/gateway-api). Input on stdin: a JSON array of objects. Output on stdout: a JSON
// array with, per object, null (valid) or the validator's message. Used by tests/gateway_api_schema.py.
import * as v1 from "@kubernetes-models/gateway-api/gateway.networking.k8s.io/v1";

const chunks = [];
for await (const chunk of process.stdin) chunks.push(chunk);
const objects = JSON.parse(Buffer.concat(chunks).toString("utf8"));
const results = objects.map((obj) => {
  if (obj.apiVersion !== "gateway.networking.k8s.io/v1" || !(obj.kind in v1)) {
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
