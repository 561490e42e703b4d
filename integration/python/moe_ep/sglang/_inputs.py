"""What SGLang hands the dispatcher, in the shapes its versions used:
dispatch's routing (a TopKOutput, or the older topk_idx / topk_weights
keywords) and combine's input (a combine-input tuple, the older keywords,
or three tensors positionally)."""
import torch


def _tensors(entry, **named):
    for name, t in named.items():
        if not isinstance(t, torch.Tensor):
            raise TypeError("%s: %s must be a torch.Tensor, got %s"
                            % (entry, name, type(t).__name__))


def routing(entry, topk_output, topk_idx, topk_weights):
    """(topk_ids, topk_weights) from SGLang's TopKOutput (attributes
    topk_ids, topk_weights) or the keywords of older SGLang versions."""
    if topk_output is not None:
        if topk_idx is not None or topk_weights is not None:
            raise TypeError("%s: pass topk_output or topk_idx/topk_weights, not both" % entry)
        try:
            topk_idx, topk_weights = topk_output.topk_ids, topk_output.topk_weights
        except AttributeError:
            raise TypeError("%s: topk_output must have topk_ids and topk_weights (SGLang's "
                            "TopKOutput), got %s" % (entry, type(topk_output).__name__)) from None
    _tensors(entry, topk_ids=topk_idx, topk_weights=topk_weights)
    if tuple(topk_idx.shape) != tuple(topk_weights.shape):
        raise ValueError("%s: topk_weights has shape %s and topk_ids %s; they pair slot by slot"
                         % (entry, tuple(topk_weights.shape), tuple(topk_idx.shape)))
    return topk_idx, topk_weights


def combine_input(entry, combine_input, topk_ids, topk_weights, hidden_states, topk_idx):
    """(hidden_states, topk_ids, topk_weights) from SGLang's combine input
    (a tuple with those attributes; combine_a(combine_input=...) in current
    SGLang), the keywords of older SGLang (hidden_states=, topk_idx=,
    topk_weights=), or the three tensors positionally."""
    if isinstance(combine_input, torch.Tensor):
        if hidden_states is not None:
            raise TypeError("%s: hidden_states given twice (positionally and by keyword)"
                            % entry)
        hidden_states, combine_input = combine_input, None
    if combine_input is not None:
        if hidden_states is not None or topk_ids is not None or topk_idx is not None or \
                topk_weights is not None:
            raise TypeError("%s: pass combine_input or hidden_states / topk_ids / "
                            "topk_weights, not both" % entry)
        try:
            hidden_states, topk_ids, topk_weights = (
                combine_input.hidden_states, combine_input.topk_ids, combine_input.topk_weights)
        except AttributeError:
            raise TypeError("%s: combine_input must have hidden_states, topk_ids and "
                            "topk_weights (SGLang's combine input), got %s"
                            % (entry, type(combine_input).__name__)) from None
    if topk_idx is not None:
        if topk_ids is not None:
            raise TypeError("%s: pass topk_ids or topk_idx, not both" % entry)
        topk_ids = topk_idx
    _tensors(entry, hidden_states=hidden_states, topk_ids=topk_ids, topk_weights=topk_weights)
    return hidden_states, topk_ids, topk_weights


def same_shape(entry, sub, **pairs):
    """Each (got, want) pair of tensors has one shape: SGLang's combine
    hands back the routing its dispatch returned (a copy is accepted)."""
    for name, (got, want) in pairs.items():
        if tuple(got.shape) != tuple(want.shape):
            raise ValueError("%s: %s has shape %s; sub-batch %d's dispatch gave %s"
                             % (entry, name, tuple(got.shape), sub, tuple(want.shape)))
