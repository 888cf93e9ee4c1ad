"""The SBOM's schema check, a test's job: apexkit writes dist/<target>/sbom.cdx.json with cyclonedx-python-lib, and
the tests check what it wrote against the CycloneDX 1.6 JSON schema the library ships (strict: no unknown
properties). The check needs the library's json-validation extra (jsonschema), which requirements/dev.in installs and
the runtime lock does not."""

from __future__ import annotations

from cyclonedx.schema import SchemaVersion
from cyclonedx.validation.json import JsonStrictValidator


class SchemaError(AssertionError):
    pass


def validate(text: str) -> None:
    """SchemaError (one line) unless `text` is valid against the CycloneDX 1.6 JSON schema."""
    error = JsonStrictValidator(SchemaVersion.V1_6).validate_str(text)
    if error is not None:
        raise SchemaError(
            "the SBOM fails the CycloneDX 1.6 schema: "
            f"{str(getattr(error, 'data', error)).splitlines()[0][:300]}"
        )
