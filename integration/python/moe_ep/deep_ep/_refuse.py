"""The one sentence every DeepEP argument moe-ep does not support raises:
NotImplementedError naming the entry, the argument, its value and why."""


def refuse(entry, arg, value, why):
    raise NotImplementedError("%s: %s=%r is not supported by moe-ep: %s" % (entry, arg, value, why))
