"""What the bench's Python steps read from a service's Prometheus metrics."""

import re
import urllib.request


def total(url, family, **labels):
    """The sum of `drip_<family>` (a counter's `_total` or a gauge) over its series whose labels
    include `labels`."""
    text = urllib.request.urlopen(url).read().decode()
    found = 0.0
    for line in re.findall(rf'^drip_{family}(?:_total)?\{{([^}}]*)\}} (\S+)$', text, re.M):
        have = dict(re.findall(r'(\w+)="([^"]*)"', line[0]))
        if all(have.get(k) == v for k, v in labels.items()):
            found += float(line[1])
    return found
