#!/usr/bin/env bash
# What `make demo` and `make setup` need from the machine: Python >= 3.10 (with venv), a JDK >= 17 and Maven
# (Apache Kafka's broker runs from its Maven Central jars). Says what is missing and how to get it; exit 1 then.
# Test tools (kcat, kubectl, promtool, Chromium) belong to `make test` alone: scripts/install-test-tools.sh.
set -uo pipefail
python=${PYTHON:-python3}
missing=()
if ! "$python" -c 'import sys, venv; sys.exit(sys.version_info < (3, 10))' 2>/dev/null; then
  missing+=("Python >= 3.10 with its venv module as \`$python\` (Debian: apt-get install python3 python3-venv; or make PYTHON=/path/to/python3.11)")
fi
if ! command -v java >/dev/null 2>&1; then
  missing+=("a JDK >= 17 (\`java\`; Debian: apt-get install openjdk-17-jdk-headless)")
else
  major=$(java -XshowSettings:properties -version 2>&1 | sed -n 's/^ *java.specification.version = \([0-9]*\).*/\1/p')
  [ "${major:-0}" -ge 17 ] 2>/dev/null || missing+=("a JDK >= 17 (\`java\` is ${major:-unknown}; Debian: apt-get install openjdk-17-jdk-headless)")
fi
command -v mvn >/dev/null 2>&1 || missing+=("Maven (\`mvn\`; Debian: apt-get install maven)")
if [ ${#missing[@]} -gt 0 ]; then
  echo "modpipe needs, and this machine lacks:" >&2
  for m in "${missing[@]}"; do echo "  - $m" >&2; done
  exit 1
fi
