"""Finding Java: Spark and the embedded Kafka broker both need a JVM (17)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from qstate.core.errors import StartFailed

__all__ = ["java"]


def java() -> str:
    """The java binary: $JAVA_HOME/bin/java, else the one on PATH."""
    home = os.environ.get("JAVA_HOME")
    if home and (Path(home) / "bin" / "java").exists():
        return str(Path(home) / "bin" / "java")
    found = shutil.which("java")
    if found is None:
        raise StartFailed("qstate needs Java 17 (Spark, the Kafka broker) and none was found: "
                          "`apt-get install openjdk-17-jre-headless`, or set JAVA_HOME")
    return found
