"""The SWIM member a node runs, built from the node's configuration.

The membership layer knows nothing of ``accord serve``'s settings; this is where
they meet: the gossip profile and keyring, the listen/advertise addresses and seeds,
and the metadata (name, member id, client URLs) the daemon publishes.
"""

from __future__ import annotations

from accord.membership.config import SwimConfig
from accord.membership.scheduler_link import SchedulerLike
from accord.membership.service import NodeMembership, daemon_meta
from accord.node.config import Config


def node_membership(cfg: Config, member_id: int, *,
                    scheduler: SchedulerLike | None = None) -> NodeMembership:
    """The membership ``accord serve`` runs, from its (validated) configuration."""
    meta = daemon_meta(cfg.name, member_id, cfg.advertise_client_urls)
    if not cfg.gossip_enabled:
        return NodeMembership(None, name=cfg.name, bind=("", 0), meta=meta)
    swim = SwimConfig.profile(cfg.gossip_profile)
    keys = cfg.gossip_keys()
    if keys:
        swim.secret_keys = keys
        swim.validate()
    return NodeMembership(swim, name=cfg.name, bind=cfg.gossip_listen_address(),
                          advertise=cfg.gossip_advertise_address(),
                          seeds=cfg.gossip_seed_addresses(), meta=meta, scheduler=scheduler)
