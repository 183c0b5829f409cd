"""Cross-checks of deploy/ that a schema cannot make (run by scripts/validate_deploy.sh after the
schema validation): the ConfigMap carries deploy/gateway.toml word for word; names, labels and ports
agree between the Deployment, the Service, the probes, the HPA, the KEDA ScaledObject and the Secret;
the autoscalers read the gateway's queue metric.

Prints one line per check and `N passed, M failed`; exits 1 if any failed.
"""

import pathlib
import sys

import yaml

ROOT = pathlib.Path(__file__).resolve().parent.parent
K8S = ROOT / "deploy" / "k8s"
results = []


def check(name, ok, detail=""):
    results.append(ok)
    print(f"{'ok  ' if ok else 'FAIL'} {name}{'' if ok else ': ' + detail}")


def load(path):
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


docs = {}
for path in sorted(K8S.rglob("*.yaml")):
    for doc in load(path):
        docs[(doc["kind"], doc["metadata"]["name"])] = doc

config_map = docs[("ConfigMap", "kvgate-gateway")]
toml = (ROOT / "deploy" / "gateway.toml").read_text()
check("the ConfigMap carries deploy/gateway.toml word for word", config_map["data"]["gateway.toml"] == toml)

deployment = docs[("Deployment", "kvgate-gateway")]
pod = deployment["spec"]["template"]
labels = pod["metadata"]["labels"]
container = pod["spec"]["containers"][0]
ports = {p["name"]: p["containerPort"] for p in container["ports"]}
check("the Deployment selects its own pods", deployment["spec"]["selector"]["matchLabels"].items() <= labels.items())
check("ports match the config file", ports == {"http": 8080, "metrics": 9100} and 'listen = "0.0.0.0:8080"' in toml
      and 'metrics_listen = "0.0.0.0:9100"' in toml, str(ports))
for probe in ["readinessProbe", "livenessProbe"]:
    target = container[probe].get("httpGet", container[probe].get("tcpSocket"))
    check(f"{probe} uses a declared port", target["port"] in ports, str(target))
mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
check("the config file is where the args say", f"{mounts['config']}/gateway.toml" in container["args"], str(container["args"]))
check("the state file is on a writable volume", 'state_file = "/var/lib/kvgate/usage.json"' in toml and mounts["state"] == "/var/lib/kvgate")
check("the grace period outlasts the drain", pod["spec"]["terminationGracePeriodSeconds"] >= 30 + 5 + 5)

service = docs[("Service", "kvgate-gateway")]
check("the Service selects the gateway's pods", service["spec"]["selector"].items() <= labels.items())
check("the Service exposes the API only (not /metrics, not admin)", [p["targetPort"] for p in service["spec"]["ports"]] == ["http"])
check("the admin endpoint is on loopback", 'admin_listen = "127.0.0.1:' in toml)

secret = docs[("Secret", "kvgate-gateway")]
check("the Secret's keys are the environment variables the binary reads",
      set(secret["stringData"]) == {"KVGATE_REDIS_URL", "KVGATE_UPSTREAM_API_KEY"})
check("the Redis URL names the Redis Service",
      "kvgate-redis.kvgate.svc:6379" in secret["stringData"]["KVGATE_REDIS_URL"] and ("Service", "kvgate-redis") in docs)

hpa = docs[("HorizontalPodAutoscaler", "kvgate-gateway")]
check("the HPA scales the gateway", hpa["spec"]["scaleTargetRef"]["name"] == deployment["metadata"]["name"])
metric = hpa["spec"]["metrics"][0]["pods"]["metric"]["name"]
check("the HPA reads the queue depth", metric == "kvgate_num_requests_waiting")
behavior = hpa["spec"]["behavior"]
check("the HPA is smoothed both ways", behavior["scaleUp"]["stabilizationWindowSeconds"] >= 60
      and behavior["scaleDown"]["stabilizationWindowSeconds"] >= 300)
rules = yaml.safe_load(docs[("ConfigMap", "kvgate-prometheus-adapter-rules")]["data"]["config.yaml"])["rules"]
check("prometheus-adapter serves that metric", rules[0]["name"]["as"] == metric and metric in rules[0]["seriesQuery"])

keda = docs[("ScaledObject", "kvgate-gateway")]
trigger = keda["spec"]["triggers"][0]
check("KEDA: the ScaledObject scales the gateway", keda["spec"]["scaleTargetRef"]["name"] == deployment["metadata"]["name"])
check("KEDA: a Prometheus trigger on the queue depth", trigger["type"] == "prometheus" and metric in trigger["metadata"]["query"]
      and float(trigger["metadata"]["threshold"]) > 0)
check("KEDA: smoothed like the HPA", keda["spec"]["advanced"]["horizontalPodAutoscalerConfig"]["behavior"] == {
    "scaleUp": {"stabilizationWindowSeconds": 60}, "scaleDown": {"stabilizationWindowSeconds": 300}})

failed = results.count(False)
print(f"{len(results) - failed} passed, {failed} failed")
sys.exit(1 if failed else 0)
