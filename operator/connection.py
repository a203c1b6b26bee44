"""One way to find the apiserver, shared by kopf and the operator's own client: a kubeconfig file when
given, else the pod's service account (in-cluster), else the default kubeconfig."""

from __future__ import annotations

from typing import TYPE_CHECKING

import kubernetes.config
from kubernetes.client import Configuration

if TYPE_CHECKING:
    import kopf


def load_configuration(kubeconfig: str | None) -> Configuration:
    configuration = Configuration()
    if kubeconfig:
        kubernetes.config.load_kube_config(config_file=kubeconfig, client_configuration=configuration)
        return configuration
    try:
        kubernetes.config.load_incluster_config(client_configuration=configuration)
    except kubernetes.config.ConfigException:
        kubernetes.config.load_kube_config(client_configuration=configuration)
    return configuration


def kopf_connection_info(configuration: Configuration) -> kopf.ConnectionInfo:
    import kopf

    # Bearer tokens (in-cluster, exec plugins) are read through the configuration each time, so a
    # rotated service-account token is picked up when kopf logs in again after a 401.
    header = configuration.get_api_key_with_prefix("BearerToken", alias="authorization")
    scheme, _, token = (header or "").rpartition(" ")
    return kopf.ConnectionInfo(
        server=configuration.host,
        ca_path=configuration.ssl_ca_cert,
        insecure=not configuration.verify_ssl,
        scheme=scheme or None,
        token=token or None,
        certificate_path=configuration.cert_file,
        private_key_path=configuration.key_file,
    )
