"""Certificates and keys for tests: a CA, and serving and client certificates it signs (the test control
plane's, a TLS router's)."""

from __future__ import annotations

import subprocess
from pathlib import Path


class OpensslError(RuntimeError):
    pass


class Pki:
    """Certificates and keys, made with the openssl CLI so the tests need no extra Python package."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        folder.mkdir()
        self.ca_cert, self.ca_key = self._issue("ca", "kvferry-test-ca", ca=True)
        # The apiserver signs ServiceAccount tokens with it and the controller-manager mints them with it.
        self.service_account_key = folder / "service-account.key"
        _openssl("ecparam", "-genkey", "-noout", "-name", "prime256v1", "-out", str(self.service_account_key))

    def _issue(
        self, name: str, common_name: str, *, organization: str = "", sans: str = "", ca: bool = False
    ) -> tuple[Path, Path]:
        cert, key, config = (self.folder / f"{name}.{ext}" for ext in ("crt", "key", "cnf"))
        extensions = (
            ["basicConstraints = critical,CA:TRUE", "keyUsage = critical,keyCertSign,cRLSign"]
            if ca
            else [
                "basicConstraints = critical,CA:FALSE",
                "keyUsage = critical,digitalSignature,keyEncipherment",
                "extendedKeyUsage = serverAuth,clientAuth",
            ]
        )
        if sans:
            extensions.append(f"subjectAltName = {sans}")
        subject = [f"CN = {common_name}"] + ([f"O = {organization}"] if organization else [])
        config.write_text(
            "\n".join(
                ["[req]", "prompt = no", "distinguished_name = dn", "x509_extensions = ext", "[dn]"]
                + subject
                + ["[ext]"]
                + extensions
            )
            + "\n"
        )
        signer = [] if ca else ["-CA", str(self.ca_cert), "-CAkey", str(self.ca_key)]
        # EC keys: generating them takes milliseconds, RSA keys take a noticeable part of a second each.
        _openssl(
            "req", "-x509", "-new", "-nodes", "-days", "7", "-config", str(config),
            "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
            "-keyout", str(key), "-out", str(cert), *signer,
        )  # fmt: skip
        return cert, key

    def serving(self, name: str, sans: str = "") -> tuple[Path, Path]:
        """A certificate for 127.0.0.1 and the control plane's names, and `sans` (openssl's form, e.g. DNS:a,IP:b)."""
        sans = ",".join(filter(None, ["IP:127.0.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,"
                                      "DNS:kubernetes.default.svc", sans]))
        return self._issue(name, name, sans=sans)

    def client(self, name: str, user: str, group: str = "") -> tuple[Path, Path]:
        return self._issue(name, user, organization=group)


def _openssl(*args: str) -> None:
    done = subprocess.run(["openssl", *args], capture_output=True, text=True)
    if done.returncode != 0:
        raise OpensslError(f"openssl {args[0]} failed: {done.stderr.strip()}")
