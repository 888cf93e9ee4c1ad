"""The file names fixture builds give their wheels (issue 16: the wheel carries the manylinux tag auditwheel computed).

The fixture's modules need GLIBC_2.4 (__stack_chk_fail) and GLIBCXX_3.4.21 (std::__cxx11 strings, any g++ >= 5):
auditwheel's symbol tag for them is manylinux_2_24_<arch>, and the build renames the wheel to it. auditwheel >= 6.5
(`show --json`) needs Python >= 3.10 on the host that runs apexkit -- here the interpreter running the tests, since
the nox build sessions run in it (python=False) -- so on an older host the wheel keeps linux_<arch>, as the manifest
then says (binary_checks.platform.kept_because)."""

from __future__ import annotations

import importlib.util

TAG_COMPUTED = importlib.util.find_spec("auditwheel") is not None


def platform_tag(arch: str = "x86_64") -> str:
    return f"manylinux_2_24_{arch}" if TAG_COMPUTED else f"linux_{arch}"


def fixture_wheel(
    version: str = "0.1+ascend.torch2.13.0", py: str = "cp311", arch: str = "x86_64"
) -> str:
    return f"apex-{version}-{py}-{py}-{platform_tag(arch)}.whl"
