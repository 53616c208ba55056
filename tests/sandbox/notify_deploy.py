"""The notifier's part of deploy.py alone (tests/sandbox/test_prometheus_scrape.py): its settings, its
webhook secret from the control machine's environment, its unit; seconds, not a whole deploy."""

from control import profile
from roles import watch

p = profile.for_current_host()
watch.notifier(p.notify_command, p.notify_journal_lines, p.notify_webhook_env)
