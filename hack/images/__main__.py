"""python -m hack.images {build,unpack} — the local clusters' OCI images (see hack/images/__init__.py).

python -m hack.images build [--only NAME...] [--binary NAME=PATH@VERSION...] [-o json]
python -m hack.images unpack IMAGE.tar DIR      # the rootfs, as a runtime would see it (root)
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path

from .build import build_images
from .rootfs import unpack_image
from .tools import BuildError


def _progress(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def _binary(spec: str) -> tuple[str, tuple[Path, str]]:
    name, sep, rest = spec.partition("=")
    path, sep2, version = rest.rpartition("@")
    if not (sep and sep2 and name and path and version):
        raise argparse.ArgumentTypeError(f"expected NAME=PATH@VERSION, got {spec!r}")
    return name, (Path(path), version)


def cmd_build(args: argparse.Namespace) -> int:
    started = time.monotonic()
    images = build_images(progress=_progress, binaries=dict(args.binary), only=args.only)
    if args.output == "json":
        rows = [
            {k: str(v) if isinstance(v, Path) else v for k, v in dataclasses.asdict(i).items()}
            for i in images.values()
        ]
        print(json.dumps(rows, indent=2))
    else:
        for image in images.values():
            state = "cached" if image.cached else f"built in {image.seconds:.0f}s"
            print(f"{image.name:<10} {image.ref:<36} {image.size / 1e6:7.1f} MB  {state:<15} {image.tar}")
    _progress(f"{len(images)} images in {time.monotonic() - started:.1f}s")
    return 0


def cmd_unpack(args: argparse.Namespace) -> int:
    unpack_image(args.image, args.dest)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hack.images", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    build = sub.add_parser("build", help="build the images, or find them in the cache")
    build.add_argument("--only", nargs="+", metavar="NAME", help="only these images")
    build.add_argument("--binary", action="append", type=_binary, default=[], metavar="NAME=PATH@VERSION",
                       help="also an image of a static binary, run as /NAME")  # fmt: skip
    build.add_argument("-o", "--output", choices=["text", "json"], default="text")
    build.set_defaults(func=cmd_build)
    unpack = sub.add_parser("unpack", help="unpack an image tar's layers into a folder")
    unpack.add_argument("image", type=Path)
    unpack.add_argument("dest", type=Path)
    unpack.set_defaults(func=cmd_unpack)
    args = parser.parse_args(argv)
    try:
        return int(args.func(args))
    except BuildError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    except OSError as e:  # a cache folder we may not write to, a full disk
        print(f"error: {e.strerror or e}: {e.filename}" if e.filename else f"error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
