#!/usr/bin/env bash
# Validates the Kubernetes example in deploy/k8s/ without a cluster: every core resource against the
# Kubernetes schemas bundled in the `kubernetes-validate` package (PyPI), strictly (unknown fields
# rejected); then scripts/validate_deploy.py's cross-checks (the ConfigMap is deploy/gateway.toml, names,
# ports, labels, the autoscalers' metric). The KEDA ScaledObject (a custom resource) gets the cross-checks
# only. What needs a cluster is listed in deploy/README.md.
#
#   scripts/validate_deploy.sh
#
# Installs kubernetes-validate into target/deploy-venv (kept between runs).
set -euo pipefail
cd "$(dirname "$0")/.."
venv="target/deploy-venv"
if [ ! -x "$venv/bin/kubernetes-validate" ]; then
    python3 -m venv "$venv"
    "$venv/bin/pip" install --quiet --disable-pip-version-check "kubernetes-validate==1.37.0" pyyaml
fi
"$venv/bin/kubernetes-validate" --version
"$venv/bin/kubernetes-validate" --strict --kubernetes-version 1.33.0 deploy/k8s/*.yaml
"$venv/bin/python" scripts/validate_deploy.py
