"""A cross-encoder's prompts: each (query, document) pair as the one prompt the classifier
reads, formed as vLLM 0.34 forms it (its cross-encoder scoring processor):

1. a score template (--chat-template) renders the pair as the messages ``query`` and
   ``document`` (the Qwen3-reranker template, with ``instruction`` and the request's
   ``chat_template_kwargs``), then the tokenizer encodes the text;
2. else, a cross-encoder that pairs with its separator (``use_sep_token``, BERT's way) is
   the tokenizer's text pair, ``[CLS] query [SEP] document [SEP]``, whose second text is
   token type 1 (``pair_sep``: the separator id the engine splits the types at);
3. else (an LM as reranker) the query and the document concatenated, encoded as one text.

Tokenizing and rendering run in a worker thread (a request holds up to
--max-pooling-inputs pairs), never on the event loop.
"""

from __future__ import annotations

from typing import Any

import trio
from actors.params.classify import Classifier
from actors.runtime.request import PromptInput

from server.frontend.chat_template import load_template_arg, render_score_template

__all__ = ["pair_prompts"]


async def pair_prompts(tokenizer: Any, head: Classifier, template: str | None,
                       pairs: list[tuple[str, str]], add_special_tokens: bool,
                       kwargs: dict[str, Any]) -> tuple[list[PromptInput], int | None]:
    """(one prompt of token ids per pair, the separator whose later rows are token type 1
    or None). Raises APIError (400) for a template that fails on these inputs."""
    source = load_template_arg(template)
    sep = (tokenizer.sep_token_id if head.bert and head.use_sep_token and source is None
           else None)

    def build() -> list[PromptInput]:
        special = {"bos_token": tokenizer.bos_token, "eos_token": tokenizer.eos_token}
        out = []
        for query, doc in pairs:
            if source is not None:
                text = render_score_template(source, query, doc, kwargs, special)
                ids = tokenizer(text, add_special_tokens=add_special_tokens)["input_ids"]
            elif head.use_sep_token:
                ids = tokenizer(text=query, text_pair=doc,
                                add_special_tokens=add_special_tokens)["input_ids"]
            else:
                ids = tokenizer(query + doc, add_special_tokens=add_special_tokens)["input_ids"]
            out.append(PromptInput(token_ids=list(ids)))
        return out

    return await trio.to_thread.run_sync(build), sep
