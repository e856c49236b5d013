#!/usr/bin/env python3
"""The Python `kubernetes` client (`CustomObjectsApi`) against Sluice's control plane.

    controlplane_client.py KUBECONFIG GROUP VERSION PLURAL serve
        Reads one JSON request per line on stdin and answers one JSON line on stdout:
          {"op": "create", "object": {...}}             -> {"name", "rv"}
          {"op": "patch", "name", "patch": {...}}       -> {"name", "rv"}   (merge patch)
          {"op": "delete", "name"}                      -> {"name", "rv", "list_rv"}
          {"op": "list", "labelSelector"?, "limit"?}    -> {"pages": [[name, ...], ...],
                                                            "rvs": [list rv per page]}
          {"op": "watch_once", "resourceVersion", "timeout"}
                                                         -> {"events": [[type, name, rv]...]}
                                                            or {"status": code, "reason"}
        Any failure is answered {"error": status, "reason"} instead.

    controlplane_client.py KUBECONFIG GROUP VERSION PLURAL watch RESOURCE_VERSION
        Watches from RESOURCE_VERSION, printing {"type", "name", "rv"} per event. When the
        server ends the watch (it stopped), prints {"type": "ENDED", "rv": LAST} and waits for
        a line on stdin: "resume" watches again from the last resourceVersion it saw, "exit"
        ends the script.
"""
import json
import sys

from kubernetes import client, config, watch
from kubernetes.client.rest import ApiException


def emit(document):
    print(json.dumps(document), flush=True)


def event_row(event):
    metadata = event["raw_object"]["metadata"]
    return [event["type"], metadata["name"], metadata["resourceVersion"]]


def serve(api, group, version, plural):
    for line in sys.stdin:
        if not line.strip():
            continue
        request = json.loads(line)
        op = request["op"]
        try:
            if op == "create":
                created = api.create_cluster_custom_object(group, version, plural, request["object"])
                emit({"name": created["metadata"]["name"], "rv": created["metadata"]["resourceVersion"]})
            elif op == "patch":
                patched = api.patch_cluster_custom_object(
                    group, version, plural, request["name"], request["patch"]
                )
                emit({"name": patched["metadata"]["name"], "rv": patched["metadata"]["resourceVersion"]})
            elif op == "delete":
                deleted = api.delete_cluster_custom_object(group, version, plural, request["name"])
                # The collection's version right after the delete: the delete's own revision
                # when this client is the only writer.
                after = api.list_cluster_custom_object(group, version, plural, limit=1)
                emit({
                    "name": request["name"],
                    "rv": deleted.get("metadata", {}).get("resourceVersion"),
                    "list_rv": after["metadata"]["resourceVersion"],
                })
            elif op == "list":
                pages, rvs, token = [], [], None
                while True:
                    kwargs = {}
                    if request.get("labelSelector"):
                        kwargs["label_selector"] = request["labelSelector"]
                    if request.get("limit"):
                        kwargs["limit"] = request["limit"]
                    if token:
                        kwargs["_continue"] = token
                    listed = api.list_cluster_custom_object(group, version, plural, **kwargs)
                    pages.append([item["metadata"]["name"] for item in listed["items"]])
                    rvs.append(listed["metadata"]["resourceVersion"])
                    token = listed["metadata"].get("continue")
                    if not token or len(pages) > 100:
                        break
                emit({"pages": pages, "rvs": rvs})
            elif op == "watch_once":
                events = []
                try:
                    for event in watch.Watch().stream(
                        api.list_cluster_custom_object,
                        group,
                        version,
                        plural,
                        resource_version=request["resourceVersion"],
                        timeout_seconds=request["timeout"],
                    ):
                        events.append(event_row(event))
                    emit({"events": events})
                except ApiException as error:
                    emit({"status": error.status, "reason": error.reason, "events": events})
            else:
                emit({"error": 0, "reason": "unknown op " + op})
        except ApiException as error:
            emit({"error": error.status, "reason": error.reason, "body": error.body})


def watch_resuming(api, group, version, plural, resource_version):
    last = resource_version
    while True:
        watcher = watch.Watch()
        try:
            for event in watcher.stream(
                api.list_cluster_custom_object,
                group,
                version,
                plural,
                resource_version=last,
                allow_watch_bookmarks=True,
                timeout_seconds=3600,
            ):
                if event["type"] == "BOOKMARK":
                    last = event["raw_object"]["metadata"]["resourceVersion"]
                    continue
                row = event_row(event)
                last = row[2]
                emit({"type": row[0], "name": row[1], "rv": row[2]})
        except ApiException as error:
            emit({"type": "API_ERROR", "status": error.status, "rv": last})
        except Exception as error:  # the connection broke rather than ended
            emit({"type": "BROKEN", "error": repr(error)[:200], "rv": last})
        emit({"type": "ENDED", "rv": last})
        command = sys.stdin.readline().strip()
        if command != "resume":
            return


def main():
    kubeconfig, group, version, plural, mode = sys.argv[1:6]
    config.load_kube_config(config_file=kubeconfig)
    api = client.CustomObjectsApi()
    if mode == "serve":
        serve(api, group, version, plural)
    elif mode == "watch":
        watch_resuming(api, group, version, plural, sys.argv[6])
    else:
        sys.exit("unknown mode " + mode)


if __name__ == "__main__":
    main()
