"""A handler module that takes ``SLOW_IMPORT_SECONDS`` (from the environment) to import: a
pool that loads it boots that much later than the others, so a reload stays in progress
while the pools that booted already claim and run tasks."""

import os
import time

time.sleep(float(os.environ.get("SLOW_IMPORT_SECONDS", "0")))


def handle(task):
    pass
