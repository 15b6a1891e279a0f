"""Make perf_analyzer 2.60.0 (its PyPI wheel, unchanged) run on a glibc older than 2.38.

    python benchmarks/serving_server/grpc_perf_analyzer_setup.py --into DIR

The ``perf-analyzer`` wheels are tagged manylinux_2_38, so on glibc 2.36 pip resolves only
the package's 0.1.0 placeholder. The binary itself needs seven symbols this C library
and its libstdc++ 12 lack: the C23 aliases ``__isoc23_strto{l,ul,ll,ull}`` and
``__isoc23_sscanf`` (the plain functions, which differ only in accepting "0b"
literals), and two libstdc++ 13 helpers (``std::ios_base_library_init``, a marker the
static ``ios_base::Init`` below stands in for, and ``basic_string::_M_replace_cold``,
the in-place replace copied from libstdc++'s own definition). This downloads the wheel,
unpacks ``perf_analyzer`` into DIR, builds ``libshim.so`` with those symbols, and marks
the binary's needs of GLIBC_2.38 / GLIBCXX_3.4.31 / GLIBCXX_3.4.32 weak so the loader
takes the preloaded ones (it still prints a warning per version on start). Then:

    python benchmarks/serving_server/grpc_perf_analyzer.py \\
        --perf-analyzer DIR/perf_analyzer --preload DIR/libshim.so

DIR belongs outside the checkout (a peer tool, e.g. /work/peers/perfanalyzer-2.60).
"""

from __future__ import annotations

import argparse
import struct
import subprocess
import sys
import zipfile
from pathlib import Path

VERSION = "2.60.0"
WEAK_VERSIONS = {"GLIBC_2.38", "GLIBCXX_3.4.31", "GLIBCXX_3.4.32"}
SHIM = r"""
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ios>

extern "C" {
long __isoc23_strtol(const char* s, char** e, int b) { return strtol(s, e, b); }
unsigned long __isoc23_strtoul(const char* s, char** e, int b) { return strtoul(s, e, b); }
long long __isoc23_strtoll(const char* s, char** e, int b) { return strtoll(s, e, b); }
unsigned long long __isoc23_strtoull(const char* s, char** e, int b) {
  return strtoull(s, e, b);
}
int __isoc23_sscanf(const char* s, const char* f, ...) {
  va_list a; va_start(a, f); int r = vsscanf(s, f, a); va_end(a); return r;
}
void _ZSt21ios_base_library_initv() {}
void _ZNSt7__cxx1112basic_stringIcSt11char_traitsIcESaIcEE15_M_replace_coldEPcmPKcmm(
    void*, char* p, size_t len1, const char* s, size_t len2, size_t how_much) {
  if (len2 && len2 <= len1) memmove(p, s, len2);
  if (how_much && len1 != len2) memmove(p + len2, p + len1, how_much);
  if (len2 > len1) {
    if (s + len2 <= p + len1) {
      memmove(p, s, len2);
    } else if (s >= p + len1) {
      const size_t poff = (s - p) + (len2 - len1);
      memcpy(p, p + poff, len2);
    } else {
      const size_t nleft = (p + len1) - s;
      memmove(p, s, nleft);
      memcpy(p + nleft, p + len2, len2 - nleft);
    }
  }
}
}
static std::ios_base::Init streams_init;
"""


def weaken(binary: bytes) -> tuple[bytes, list[str]]:
    """``binary`` with the version needs in WEAK_VERSIONS flagged VER_FLG_WEAK."""
    data = bytearray(binary)
    shoff, = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum = struct.unpack_from("<HH", data, 0x3A)
    sections = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize)
                for i in range(shnum)]
    verneed = next(s for s in sections if s[1] == 0x6FFFFFFE)  # SHT_GNU_verneed
    strings = sections[verneed[6]][4]  # sh_link: the dynamic string table's offset

    def name(offset: int) -> str:
        start = strings + offset
        return bytes(data[start:data.index(0, start)]).decode()

    weakened, entry = [], verneed[4]
    while True:
        _, count, _, aux, following = struct.unpack_from("<HHIII", data, entry)
        at = entry + aux
        for _ in range(count):
            _, flags, _, name_offset, next_aux = struct.unpack_from("<IHHII", data, at)
            if name(name_offset) in WEAK_VERSIONS:
                struct.pack_into("<H", data, at + 4, flags | 0x2)  # VER_FLG_WEAK
                weakened.append(name(name_offset))
            at += next_aux
        if not following:
            return bytes(data), weakened
        entry += following


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--into", type=Path, required=True, help="where to put the tool")
    args = parser.parse_args()
    into = args.into.resolve()
    into.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-m", "pip", "download", f"perf-analyzer=={VERSION}",
                    "--no-deps", "--only-binary=:all:", "--platform",
                    "manylinux_2_38_x86_64", "-d", str(into)], check=True)
    wheel = next(into.glob(f"perf_analyzer-{VERSION}-*.whl"))
    with zipfile.ZipFile(wheel) as archive:
        original = archive.read("perf_analyzer/bin/perf_analyzer")
    patched, weakened = weaken(original)
    binary = into / "perf_analyzer"
    binary.write_bytes(patched)
    binary.chmod(0o755)
    (into / "shim.cc").write_text(SHIM)
    subprocess.run(["g++", "-O2", "-shared", "-fPIC", "-o", str(into / "libshim.so"),
                    str(into / "shim.cc")], check=True)
    print(f"{binary} (weak: {', '.join(weakened)}), preload {into / 'libshim.so'}")


if __name__ == "__main__":
    main()
