// Validates Prometheus Operator objects (JSON files) against the operator's API schemas as
// compiled in the npm package @kubernetes-models/prometheus-operator (generated from the
// operator's Go API types). Run by xtask with setup's node prefix:
//   node crd_validate.mjs PREFIX FILE...
import { readFileSync } from "node:fs";
import { pathToFileURL } from "node:url";

const [prefix, ...files] = process.argv.slice(2);
const models = `${prefix}/node_modules/@kubernetes-models/prometheus-operator`;
let failed = 0;
for (const file of files) {
  const object = JSON.parse(readFileSync(file, "utf8"));
  const [group, version] = object.apiVersion.split("/");
  const url = pathToFileURL(`${models}/${group}/${version}/${object.kind}.js`);
  try {
    const module = await import(url.href);
    new module[object.kind](object).validate();
    console.log(`${file}: ${object.kind} ${object.metadata.name} valid`);
  } catch (e) {
    failed++;
    console.log(`${file}: ${object.kind} ${object.metadata?.name} INVALID: ${e.message}`);
  }
}
process.exit(failed ? 1 : 0);
