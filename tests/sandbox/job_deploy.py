"""A deploy of one job through roles/operations/job.py (tests/sandbox/test_job.py): it fails with 3."""

from control import profile
from roles.operations.job import job

job(
    name="A job that prints two lines and fails",
    profile=profile.for_current_host(),
    job_name="test-op",
    command=["sh", "-c", "echo ran > /tmp/glm-flash-job-test/op; echo op-line-one; echo op-line-two; exit 3"],
)
