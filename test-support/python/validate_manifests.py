"""Checks Kubernetes manifests against the API's types, offline: every field must be one the
kind defines (at any depth), of the right type, and every field the type requires must be
there. The types are the official Python client's models, generated from the OpenAPI the
apiserver serves, so no cluster is needed. Kinds the
client does not know (the Prometheus operator's PodMonitor) are checked by a small schema
below.

Usage: validate_manifests.py FILE...          prints one line per problem, exits 1 if any.
       validate_manifests.py --dump FILE...   prints every object as one JSON list (for the
                                              Rust test's cross-checks: ports, files, images).
"""
import json
import sys

import pydantic
import yaml
from kubernetes import client

# apiVersion group -> the client's class prefix.
PREFIXES = {"v1": "V1", "apps/v1": "V1", "policy/v1": "V1", "rbac.authorization.k8s.io/v1": "V1"}

# The fields of monitoring.coreos.com/v1 PodMonitor these manifests may use (the operator's
# CRD has more; one not listed here is reported, so a misspelt field is too).
SECRET_OR_CONFIG_MAP = {"secret": {"name": str, "key": str}, "configMap": {"name": str, "key": str}}
POD_MONITOR = {
    "apiVersion": str, "kind": str,
    "metadata": {"name": str, "namespace": str, "labels": dict},
    "spec": {"selector": {"matchLabels": dict}, "namespaceSelector": {"matchNames": list},
             "podMetricsEndpoints": [{
                 "port": str, "path": str, "interval": str, "scheme": str,
                 "tlsConfig": {"ca": SECRET_OR_CONFIG_MAP, "serverName": str,
                               "insecureSkipVerify": bool},
             }]},
}



def check(document, type_name, problems):
    """The client's models are pydantic models generated from the API's OpenAPI: unknown
    fields are forbidden, required ones enforced, scalars strictly typed."""
    cls = getattr(client, type_name, None)
    if cls is None:
        problems.append(f"unknown kind {type_name}")
        return
    try:
        cls.model_validate(document)
    except pydantic.ValidationError as error:
        for item in error.errors():
            where = ".".join(str(part) for part in item["loc"])
            problems.append(f"{where}: {item['msg']}")


def check_schema(value, schema, path, problems):
    if isinstance(schema, dict):
        if not isinstance(value, dict):
            problems.append(f"{path}: expected an object")
            return
        for key, item in value.items():
            if key not in schema:
                problems.append(f"{path}.{key}: not a field of PodMonitor")
            else:
                check_schema(item, schema[key], f"{path}.{key}", problems)
    elif isinstance(schema, list):
        if not isinstance(value, list):
            problems.append(f"{path}: expected a list")
            return
        for index, item in enumerate(value):
            check_schema(item, schema[0], f"{path}[{index}]", problems)
    elif not isinstance(value, schema):
        problems.append(f"{path}: expected {schema.__name__}")


def validate(document, origin):
    problems = []
    api_version, kind = document.get("apiVersion"), document.get("kind")
    if kind == "PodMonitor" and api_version == "monitoring.coreos.com/v1":
        check_schema(document, POD_MONITOR, kind, problems)
        for field in ("selector", "podMetricsEndpoints"):
            if field not in document.get("spec", {}):
                problems.append(f"PodMonitor.spec.{field}: required")
    elif api_version in PREFIXES:
        check(document, PREFIXES[api_version] + str(kind), problems)
    else:
        problems.append(f"{kind}: unknown apiVersion {api_version!r}")
    name = document.get("metadata", {}).get("name", "?")
    return [f"{origin}: {kind}/{name}: {problem}" for problem in problems]


def dump(paths):
    documents = []
    for path in paths:
        with open(path) as handle:
            documents.extend(document for document in yaml.safe_load_all(handle) if document)
    print(json.dumps(documents))
    return 0


def main(paths):
    problems = []
    count = 0
    for path in paths:
        with open(path) as handle:
            for document in yaml.safe_load_all(handle):
                if document:
                    count += 1
                    problems.extend(validate(document, path))
    for problem in problems:
        print(problem)
    print(f"{count} objects checked, {len(problems)} problems")
    return 1 if problems else 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["--dump"]:
        sys.exit(dump(sys.argv[2:]))
    sys.exit(main(sys.argv[1:]))
