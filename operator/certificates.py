"""Certificates for TLS between router and nodes: a cluster's own CA and the nodes' serving certificate it
signs, each a pure function of the operator's signing seed, the cluster and the time.

The operator keeps no key anywhere it would have to read back: a cluster's CA key and each period's serving
key are derived from the seed (HKDF, labelled with the cluster's uid), serial numbers from the same labels, and
signatures are deterministic (RFC 6979). So a reconcile computes, byte for byte, the Secret it wrote before,
and applying it again changes nothing; once two thirds of a certificate's lifetime have passed, the same
computation yields the next period's certificate, which the next reconcile writes. The CA stays the same
for its 10 years, so routers keep trusting the nodes across every rotation.

EC P-256 keys: spoken by every TLS stack involved (Python's ssl in router and nodes, Go's in the kubelet's probes).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

MIN_SEED_BYTES = 32
CA_LIFETIME = timedelta(days=3650)
SERVING_LIFETIME = timedelta(days=90)
# A new certificate once less than this share of the current one's lifetime is left: a month of a 90-day
# certificate, for failed reconciles to be retried and pods to load the new files before the old one ends.
RENEW_WHEN_LEFT = 1 / 3
# notBefore is set this far back, so that a node whose clock runs a little behind accepts a new certificate.
CLOCK_SKEW = timedelta(minutes=5)
# The order of P-256's group: a private key is an integer in [1, order).
_P256_ORDER = 0xFFFFFFFF00000000FFFFFFFFFFFFFFFFBCE6FAADA7179E84F3B9CAC2FC632551


@dataclass(frozen=True)
class KeyPair:
    cert_pem: bytes
    key_pem: bytes


@dataclass(frozen=True)
class Period:
    """One serving certificate's place in time: the `index`-th since the cluster's creation."""

    index: int
    not_before: datetime
    not_after: datetime


def serving_period(created: datetime, now: datetime, lifetime: timedelta = SERVING_LIFETIME) -> Period:
    """The certificate to serve at `now`: a new one every (1 - RENEW_WHEN_LEFT) of `lifetime`, counted from the
    cluster's creation, so the one in use always has more than RENEW_WHEN_LEFT of its lifetime left."""
    every = lifetime * (1 - RENEW_WHEN_LEFT)
    index = max(0, int((now - created) / every))
    begins = created + every * index
    return Period(index, begins - CLOCK_SKEW, begins + lifetime)


def _derived_key(seed: bytes, label: str) -> ec.EllipticCurvePrivateKey:
    # 48 bytes reduced modulo a 256-bit order: the bias is 2**-128, nothing.
    material = HKDF(algorithm=hashes.SHA256(), length=48, salt=None, info=label.encode()).derive(seed)
    return ec.derive_private_key(int.from_bytes(material, "big") % (_P256_ORDER - 1) + 1, ec.SECP256R1())


def _serial(label: str) -> int:
    return int.from_bytes(hashlib.sha256(label.encode()).digest()[:16], "big") >> 1 | 1  # positive, < 2**127


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def _signed(builder: x509.CertificateBuilder, key: ec.EllipticCurvePrivateKey) -> bytes:
    return builder.sign(key, hashes.SHA256(), ecdsa_deterministic=True).public_bytes(
        serialization.Encoding.PEM
    )


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def cluster_ca(seed: bytes, cluster_uid: str, common_name: str, created: datetime) -> KeyPair:
    """The cluster's CA: it may sign end certificates only (path length 0), for CA_LIFETIME from `created`."""
    label = f"kvferry/internal-ca/{cluster_uid}"
    key = _derived_key(seed, label)
    public = key.public_key()
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(common_name))
        .issuer_name(_name(common_name))
        .public_key(public)
        .serial_number(_serial(label))
        .not_valid_before(created - CLOCK_SKEW)
        .not_valid_after(created + CA_LIFETIME)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=False,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(public), critical=False)
    )
    return KeyPair(_signed(builder, key), _key_pem(key))


def serving_certificate(
    seed: bytes, cluster_uid: str, ca: KeyPair, dns_names: Sequence[str], period: Period
) -> KeyPair:
    """The nodes' certificate of `period`, for `dns_names`, signed by `ca`; its key is the period's own."""
    label = f"kvferry/internal-tls/{cluster_uid}/{period.index}/{','.join(dns_names)}"
    key = _derived_key(seed, label)
    ca_cert = x509.load_pem_x509_certificate(ca.cert_pem)
    ca_key = serialization.load_pem_private_key(ca.key_pem, password=None)
    assert isinstance(ca_key, ec.EllipticCurvePrivateKey), "made by cluster_ca"
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(dns_names[0]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(_serial(label))
        .not_valid_before(period.not_before)
        .not_valid_after(period.not_after)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(
            x509.SubjectAlternativeName([x509.DNSName(name) for name in dns_names]), critical=False
        )
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False
        )
    )
    return KeyPair(_signed(builder, ca_key), _key_pem(key))
