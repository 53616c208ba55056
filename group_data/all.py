"""pyinfra runs this while it loads any inventory (run from the repo, as the README says), before
it connects to any host: every host it loaded is checked against the profile, however the
inventory names them (a plain list or tuple, groups with data, or the hosts() helper). The file
binds no names of its own, so it adds no group data."""

from control.profile import check_inventory

check_inventory()
