"""Checks Kubernetes manifests against the API's types, offline: every field must be one the
kind defines (at any depth), of the right type, and every field the type requires must be
there. The types are the official Python client's models, generated from the OpenAPI the
apiserver serves, so no cluster is needed. Kinds the
client does not know (the Prometheus operator's ServiceMonitor) are checked by a small schema
below.

Usage: validate_manifests.py FILE...   prints one line per problem, exits 1 if any.
"""
import sys

import pydantic
import yaml
from kubernetes import client

# apiVersion group -> the client's class prefix.
PREFIXES = {"v1": "V1", "apps/v1": "V1", "policy/v1": "V1", "rbac.authorization.k8s.io/v1": "V1"}

SERVICE_MONITOR = {
    "apiVersion": str, "kind": str,
    "metadata": {"name": str, "namespace": str, "labels": dict},
    "spec": {"selector": {"matchLabels": dict}, "namespaceSelector": {"matchNames": list},
             "endpoints": [{"port": str, "path": str, "interval": str, "scheme": str}]},
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
                problems.append(f"{path}.{key}: not a field of ServiceMonitor")
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
    if kind == "ServiceMonitor" and api_version == "monitoring.coreos.com/v1":
        check_schema(document, SERVICE_MONITOR, kind, problems)
        for field in ("selector", "endpoints"):
            if field not in document.get("spec", {}):
                problems.append(f"ServiceMonitor.spec.{field}: required")
    elif api_version in PREFIXES:
        check(document, PREFIXES[api_version] + str(kind), problems)
    else:
        problems.append(f"{kind}: unknown apiVersion {api_version!r}")
    name = document.get("metadata", {}).get("name", "?")
    return [f"{origin}: {kind}/{name}: {problem}" for problem in problems]


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
    sys.exit(main(sys.argv[1:]))
