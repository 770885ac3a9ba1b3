"""Print the podman build options that show an image build this host's pip
setup (tools/build-image.sh): `-v PATH:PATH:ro` for its configuration files
and every local path they name (a site's wheels and index mirrors, a
constraints file), so pip inside the build installs what a bare install here
would, from where it would; and its CA bundle (a TLS proxy's, say) at
CERT_INSIDE, named by `--build-arg PIP_CERT`, because Debian's ca-certificates
rewrites the image's own bundle while the build installs packages. One option
per line; none where pip has no configuration. Run with the Python whose pip
the bare installs use."""

import os
import subprocess
import sys

# pip config keys whose values are local paths (or file:// URLs) to mount.
PATH_KEYS = ("cert", "client-cert", "constraint", "find-links", "index-url", "extra-index-url")
CERT_INSIDE = "/run/host-pip-cert.pem"


def main() -> int:
    debug = subprocess.run(
        [sys.executable, "-m", "pip", "config", "debug"], capture_output=True, text=True
    ).stdout
    paths, certs = set(), set()
    for line in debug.splitlines():
        line = line.strip()
        if line.endswith(", exists: True"):  # a configuration file pip reads
            paths.add(line.split(",")[0])
        elif "=" in line or ": " in line:
            key, _, value = line.partition("=" if line.startswith("PIP_") else ": ")
            name = key.split(".")[-1].lower().replace("pip_", "").replace("_", "-")
            if name in PATH_KEYS:
                for word in value.strip("'\"").split():
                    path = word[len("file://") :] if word.startswith("file://") else word
                    # An index's pages link to its files beside it (../../files/).
                    is_index = name.endswith("index-url") and os.path.basename(path) == "simple"
                    path = os.path.dirname(path) if is_index else path
                    (certs if name == "cert" else paths).add(path)
    for path in sorted(p for p in paths if p.startswith("/") and os.path.exists(p)):
        print(f"-v {path}:{path}:ro")
    for path in sorted(p for p in certs if os.path.exists(p))[:1]:  # pip reads one
        print(f"-v {path}:{CERT_INSIDE}:ro")
        print(f"--build-arg PIP_CERT={CERT_INSIDE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
