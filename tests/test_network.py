"""The network layer alone (no MPI): routes, shared ports, message timing, presets."""
from __future__ import annotations

import random

import pytest

from mpiemu.net import Network, arrival, list_networks, load_network, send
from mpiemu.sim.calendar import PortCalendar
from mpiemu.sim.timeline import Timeline
from tests.timed import network

S = 240e6          # bytes: 1 ms at DGX A100's 240 GB/s port


def test_calendar_fills_gaps_in_issue_order() -> None:
    cal = PortCalendar()
    assert cal.occupy(0.0, 1.0) == (0.0, 1.0)
    assert cal.occupy(3.0, 1.0) == (3.0, 4.0)
    assert cal.occupy(0.5, 2.5) == (1.0, 4.5)      # the 1-3 gap, then 0.5 after 4
    assert cal.first_idle(2.0) == 4.5 and cal.busy_until() == 4.5


def _first_fit(busy: list[tuple[float, float]], ready: float, length: float
               ) -> list[tuple[float, float]]:
    """The sharing rule written plainly: idle time from `ready` on, taken gap by gap."""
    t, left, out = ready, length, []
    for a, b in sorted(busy) + [(float("inf"), float("inf"))]:
        if b <= t:
            continue
        if a > t:
            take = min(left, a - t)
            out.append((t, t + take))
            left -= take
            if left <= 0.0:
                return out
        t = max(t, b)
    return out


def test_calendar_equals_first_fit_over_idle_gaps_on_random_reservations() -> None:
    """Against the rule written plainly (`_first_fit`): same start and end for every one of
    thousands of random reservations, single-piece (the fast path) and split alike."""
    rnd = random.Random(7)
    for _ in range(50):
        cal, busy = PortCalendar(), []
        for _ in range(60):
            ready = rnd.choice([rnd.random() * 10, float(rnd.randint(0, 20)) / 2,
                                cal.busy_until()])
            length = rnd.choice([rnd.random(), rnd.randint(1, 4) / 4, rnd.random() * 1e-3])
            pieces = _first_fit(busy, ready, length)
            assert cal.occupy(ready, length) == pytest.approx((pieces[0][0], pieces[-1][1]),
                                                              rel=1e-12, abs=1e-12)
            busy += pieces


def test_two_flows_through_one_egress_port_share_its_bandwidth() -> None:
    """Device 0 sends S bytes to 1 and to 2 at once: together they take 2 S / B, each
    moving at half the port's rate on average over that time."""
    net, tl = Network(network("dgx-a100"), 8), Timeline()
    rate = net.rate(net.hop(0, 1), "simple")
    heads = [send(tl, net, 0, d, S, 0.0, "simple", label="x", peer=d) for d in (1, 2)]
    ends = [arrival(tl, net, 0, d, h) for d, h in zip((1, 2), heads)]
    lat = net.latency(net.hop(0, 1), "simple")
    assert ends == pytest.approx([S / rate + lat, 2 * S / rate + lat], rel=1e-12)
    assert 2 * S / (max(ends) - lat) == pytest.approx(rate, rel=1e-12)
    assert all(S / (max(ends) - lat) == pytest.approx(rate / 2) for _ in ends)


def test_two_flows_into_one_ingress_port_share_it_too() -> None:
    """1 -> 0 and 2 -> 0 leave different ports at once; 0's ingress takes them in turn."""
    net, tl_recv = Network(network("dgx-a100"), 8), Timeline()
    heads = [send(Timeline(), net, s, 0, S, 0.0, "simple", label="x", peer=0) for s in (1, 2)]
    ends = sorted(arrival(tl_recv, net, s, 0, h) for s, h in zip((1, 2), heads))
    rate, lat = net.rate(net.hop(1, 0), "simple"), net.latency(net.hop(1, 0), "simple")
    assert ends == pytest.approx([S / rate + lat, 2 * S / rate + lat], rel=1e-12)


def test_a_mesh_gives_each_pair_its_own_link() -> None:
    net, tl = Network(network("dgx1-v100"), 8), Timeline()
    heads = [send(tl, net, 0, d, S, 0.0, "simple", label="x", peer=d) for d in (1, 2)]
    assert heads[0][1] == heads[1][1]                   # both end together
    assert net.hop(0, 1).ingress is None and net.hop(0, 1).egress != net.hop(0, 2).egress


def test_routes_per_topology() -> None:
    dgx = Network(network("dgx-a100"), 16)
    assert dgx.nodes == 2 and dgx.per_node == 8 and dgx.node_of(9) == 1
    assert dgx.hop(0, 3).label == "port.0.out>port.3.in" and not dgx.hop(0, 3).inter_node
    assert dgx.hop(3, 11).label == "nic.3.out>nic.11.in" and dgx.hop(3, 11).inter_node
    ring = Network(network("t3-ring"), 8)
    assert ring.hop(0, 1).label == "link.0>1" and ring.hop(0, 7).label == "link.0>7"
    assert ring.hop(0, 3).hops == 3 and ring.hop(0, 3).egress == "link.0>1"
    assert ring.hop(0, 5).hops == 3 and ring.hop(0, 5).egress == "link.0>7"


@pytest.mark.parametrize("fields, size, words", [
    ({"devices_per_node": 3}, 8, "devices_per_node=3 does not divide"),
    ({"topology": "switch", "devices_per_node": 4}, 8, "'hierarchical'"),
])
def test_a_network_that_cannot_hold_the_job_says_why(fields: dict, size: int,
                                                     words: str) -> None:
    with pytest.raises(ValueError, match=words):
        Network(network("dgx-a100", **fields), size)


def test_bad_spec_values_are_refused() -> None:
    with pytest.raises(ValueError, match="bw="):
        network("dgx-a100", bw=0.0)
    with pytest.raises(ValueError, match="topology"):
        network("dgx-a100", topology="torus")
    with pytest.raises(ValueError, match="call_latency_scale=0"):
        network("dgx-a100", call_latency_scale=0.0)
    with pytest.raises(ValueError, match="hop_latency_scale.simple=-1"):
        network("dgx-a100", hop_latency_scale={"simple": -1.0})


def test_latency_scales_multiply_base_and_hop_latencies_apart() -> None:
    """The calibrated constants: the call scale multiplies each call's base latency only,
    a protocol's hop scale that protocol's hop latencies only; rates untouched."""
    one = network("dgx-a100", call_latency_scale=1.0,
                  hop_latency_scale={"ll": 1.0, "ll128": 1.0, "simple": 1.0})
    call = network("dgx-a100", call_latency_scale=3.0,
                   hop_latency_scale={"ll": 1.0, "ll128": 1.0, "simple": 1.0})
    hop = network("dgx-a100", call_latency_scale=1.0,
                  hop_latency_scale={"ll": 1.0, "ll128": 1.0, "simple": 2.0})
    n1, nc, nh = Network(one, 16), Network(call, 16), Network(hop, 16)
    for a, b in ((0, 3), (3, 11)):
        for proto in ("ll", "ll128", "simple"):
            k = 2.0 if proto == "simple" else 1.0
            for algo in ("ring", "tree"):
                lat = n1.latency(n1.hop(a, b), proto, algo)
                assert nc.latency(nc.hop(a, b), proto, algo) == lat
                assert nh.latency(nh.hop(a, b), proto, algo) == pytest.approx(k * lat,
                                                                             rel=1e-15)
            assert nh.rate(nh.hop(a, b), proto) == n1.rate(n1.hop(a, b), proto)
    for algo, proto in (("ring", "simple"), ("tree", "ll"), ("nvls", "simple")):
        assert call.base(algo, proto) == pytest.approx(3 * one.base(algo, proto), rel=1e-15)
        assert hop.base(algo, proto) == one.base(algo, proto)
    t3 = load_network("t3-ring")                                  # the paper's own numbers
    assert t3.call_latency_scale == 1.0 and not t3.hop_latency_scale


@pytest.mark.parametrize("name", list_networks())
def test_every_network_number_has_a_source(name: str) -> None:
    spec = load_network(name)
    assert spec.sources and all(v.strip() for v in spec.sources.values())
    assert "simple" in spec.protocols
