#!/bin/bash
# A Spark executor in a pod of the qstate image (Spark on Kubernetes; k8s/executor-pod-template
# .yaml makes this the executor container's command). Spark starts executor pods with the
# argument "executor" and describes the executor in SPARK_* variables, which Spark's own images
# read in their entrypoint; this image has no Spark distribution, only the pip-installed
# PySpark, whose jars hold Spark's Kubernetes executor backend too.
set -euo pipefail

if [ "${1:-}" != executor ]; then
  echo "usage: $0 executor   (Spark on Kubernetes runs it, with SPARK_* set)" >&2
  exit 2
fi
spark_home=${SPARK_HOME:-$(python -c 'import os, pyspark; print(os.path.dirname(pyspark.__file__))')}
# Spark passes the executor's JVM options as SPARK_JAVA_OPT_0, _1, ... in that order
mapfile -t java_opts < <(env | grep '^SPARK_JAVA_OPT_' | sort -t_ -k4 -n | sed 's/^[^=]*=//')
# Spark mounts the executor's settings at SPARK_CONF_DIR
classpath="${SPARK_CONF_DIR:-$spark_home/conf}:$spark_home/jars/*${SPARK_EXTRA_CLASSPATH:+:$SPARK_EXTRA_CLASSPATH}"
exec "${JAVA_HOME:-/usr}/bin/java" "${java_opts[@]}" \
  -Xms"$SPARK_EXECUTOR_MEMORY" -Xmx"$SPARK_EXECUTOR_MEMORY" \
  -cp "$classpath" \
  org.apache.spark.scheduler.cluster.k8s.KubernetesExecutorBackend \
  --driver-url "$SPARK_DRIVER_URL" \
  --executor-id "$SPARK_EXECUTOR_ID" \
  --cores "$SPARK_EXECUTOR_CORES" \
  --app-id "$SPARK_APPLICATION_ID" \
  --hostname "$SPARK_EXECUTOR_POD_IP" \
  --resourceProfileId "$SPARK_RESOURCE_PROFILE_ID" \
  --podName "$SPARK_EXECUTOR_POD_NAME"
