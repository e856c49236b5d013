#!/usr/bin/env python3
"""The Python `kubernetes` client as the gateway tests use it.

    kube_list_watch.py KUBECONFIG NAMESPACE STOP_AT

Prints `list NAME,NAME...`, then `event TYPE NAME` per watch event until a pod named STOP_AT
appears (or 20 s pass).
"""
import sys

from kubernetes import client, config, watch

kubeconfig, namespace, stop_at = sys.argv[1:4]
config.load_kube_config(config_file=kubeconfig)
api = client.CoreV1Api()
print("list", ",".join(pod.metadata.name for pod in api.list_namespaced_pod(namespace).items), flush=True)
for event in watch.Watch().stream(api.list_namespaced_pod, namespace, timeout_seconds=20):
    print("event", event["type"], event["object"].metadata.name, flush=True)
    if event["object"].metadata.name == stop_at:
        break
