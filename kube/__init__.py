"""gpuferry's shared layer: clients, watches, queues, errors, settings, logs, metrics, tasks.

It imports nothing from ``vk``, ``peering`` or ``netfabric``; they import from it.
"""
