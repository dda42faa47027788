#!/usr/bin/env python3
"""Splits the agent's overhead past systemd's signal into its parts, per unit of a benchmark's
event phase, from a build with probe.patch applied.

usage: overhead_parts.py AGENT_PROBE OBSERVER_PROBE BENCH_JSON

AGENT_PROBE and OBSERVER_PROBE are the files the patched agent and observer write at exit
(/work/probe-out/probe-PID; the agent's is the largest). For each unit whose terminal signal
the observer saw, with t_obs its stamp of that signal:
  delivery  the agent's stream yielded the same message (by serial), minus t_obs
  queued    the agent began decoding it, minus delivery (signals of the same turn before it)
  to_read   the proof's cgroup read began, minus queued (its decode and the core)
  read      the cgroup read
  stamp     the proof's proven_mono_ns minus the end of the read
  in_agent  the proof's proven_mono_ns minus delivery: all of the above but delivery
  overhead  what bench.json reports (t_event - t_signal)
"""
import json
import sys


def main(agent, observer, bench):
    events = []
    for line in open(agent):
        t, what, *rest = line.rstrip('\n').split(' ', 2)
        events.append((int(t), what, rest[0] if rest else ''))
    arrive, handle, reads = {}, {}, []
    for t, what, detail in events:
        if what == 'arrive':
            arrive.setdefault(int(detail.split()[0]), t)
        elif what == 'handle':
            handle.setdefault(int(detail.split()[0]), t)
        elif what in ('read0', 'read1'):
            reads.append((t, what, detail.split()[0]))
    samples = {s['unit']: s for s in json.load(open(bench))['run']['samples']
               if s['phase'] == 'event'}
    names = ('delivery', 'queued', 'to_read', 'read', 'stamp', 'in_agent', 'overhead')
    parts = {k: [] for k in names}
    for line in open(observer):
        fields = line.split()
        if fields[1] != 'observed':
            continue
        _, _, serial, unit, at = fields
        serial, at = int(serial), int(at)
        sample = samples.get(unit)
        if sample is None or serial not in arrive or serial not in handle:
            continue
        cgroup = '/' + unit
        after = [r for r in reads if r[2].endswith(cgroup) and r[0] >= handle[serial]]
        r0 = next((t for t, w, _ in after if w == 'read0'), None)
        r1 = next((t for t, w, _ in after if w == 'read1'), None)
        if r0 is None or r1 is None:
            continue
        parts['delivery'].append(arrive[serial] - at)
        parts['queued'].append(handle[serial] - arrive[serial])
        parts['to_read'].append(r0 - handle[serial])
        parts['read'].append(r1 - r0)
        parts['stamp'].append(sample['t_event_ns'] - r1)
        parts['in_agent'].append(sample['t_event_ns'] - arrive[serial])
        parts['overhead'].append(sample['t_event_ns'] - sample['t_signal_ns'])
    for name, values in parts.items():
        values.sort()
        n = len(values)
        if n == 0:
            print(f'{name}: no samples')
            continue
        q = lambda f: values[min(n - 1, int(n * f))] / 1000
        print(f'{name:9} n={n} p10={q(0.1):.1f} p50={q(0.5):.1f} p90={q(0.9):.1f} '
              f'max={values[-1] / 1000:.1f} us')


if __name__ == '__main__':
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    main(*sys.argv[1:])
