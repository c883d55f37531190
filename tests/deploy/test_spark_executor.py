"""deploy/spark-executor.sh, the executor container's command: given what Spark on Kubernetes
puts in an executor pod (the argument "executor", SPARK_* variables), it starts Spark's
Kubernetes executor backend with the arguments that class parses. Run here with a stand-in
`java` that prints its command line, so no JVM starts."""

from __future__ import annotations

import os
import stat
import subprocess
import zipfile
from pathlib import Path

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
SCRIPT = DEPLOY / "spark-executor.sh"
BACKEND = "org.apache.spark.scheduler.cluster.k8s.KubernetesExecutorBackend"

# what Spark's executor pod feature step sets (a real executor's values, shortened)
SPARK_ENV = {
    "SPARK_DRIVER_URL": "spark://CoarseGrainedScheduler@10.0.0.5:7078",
    "SPARK_EXECUTOR_ID": "3",
    "SPARK_EXECUTOR_CORES": "1",
    "SPARK_EXECUTOR_MEMORY": "2048m",
    "SPARK_APPLICATION_ID": "spark-0123abcd",
    "SPARK_EXECUTOR_POD_IP": "10.0.1.7",
    "SPARK_EXECUTOR_POD_NAME": "qstate-tweets-exec-3",
    "SPARK_RESOURCE_PROFILE_ID": "0",
    "SPARK_CONF_DIR": "/opt/spark/conf",
    "SPARK_JAVA_OPT_1": "-Dspark.driver.port=7078",
    "SPARK_JAVA_OPT_0": "-Djava.net.preferIPv6Addresses=false",
    "SPARK_JAVA_OPT_10": "-Dspark.blockManager.port=7079",
}


def run(tmp_path: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    java = tmp_path / "bin" / "java"
    java.parent.mkdir(exist_ok=True)
    java.write_text('#!/bin/sh\nfor a in "$@"; do printf "%s\\n" "$a"; done\n')
    java.chmod(java.stat().st_mode | stat.S_IEXEC)
    base = {"PATH": os.environ["PATH"], "JAVA_HOME": str(tmp_path), "SPARK_HOME": "/spark"}
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True,
                          env={**base, **env}, timeout=30)


def test_it_starts_the_kubernetes_executor_backend(tmp_path: Path) -> None:
    out = run(tmp_path, "executor", **SPARK_ENV)
    assert out.returncode == 0, out.stderr
    argv = out.stdout.splitlines()
    # JVM options in Spark's order (0, 1, 10: numeric, not text order), then heap and classpath
    assert argv[:3] == ["-Djava.net.preferIPv6Addresses=false", "-Dspark.driver.port=7078",
                        "-Dspark.blockManager.port=7079"]
    assert argv[3:7] == ["-Xms2048m", "-Xmx2048m", "-cp", "/opt/spark/conf:/spark/jars/*"]
    assert argv[7] == BACKEND
    opts = dict(zip(argv[8::2], argv[9::2], strict=True))
    assert opts == {
        "--driver-url": SPARK_ENV["SPARK_DRIVER_URL"],
        "--executor-id": "3", "--cores": "1", "--app-id": "spark-0123abcd",
        "--hostname": "10.0.1.7", "--resourceProfileId": "0",
        "--podName": "qstate-tweets-exec-3",
    }


def test_it_refuses_anything_but_executor_and_a_missing_setting(tmp_path: Path) -> None:
    assert run(tmp_path, "driver", **SPARK_ENV).returncode == 2
    missing = {k: v for k, v in SPARK_ENV.items() if k != "SPARK_DRIVER_URL"}
    out = run(tmp_path, "executor", **missing)
    assert out.returncode != 0 and "SPARK_DRIVER_URL" in out.stderr


def test_the_backend_class_is_in_the_installed_pyspark() -> None:
    import pyspark
    jars = Path(pyspark.__file__).parent / "jars"
    [k8s_jar] = jars.glob("spark-kubernetes_*.jar")
    with zipfile.ZipFile(k8s_jar) as z:
        assert BACKEND.replace(".", "/") + ".class" in z.namelist()
