"""Rollout engines registered under the ``rl.rollouts`` entry point group.

``hf`` (`HFRolloutEngine`, extra ``hf``), ``vllm`` (`VLLMRolloutEngine`, extra ``vllm``) and
``sglang`` (`SGLangRolloutEngine`, extra ``sglang``). Each lives in its own module and
imports its engine library only when it is built, so this package imports without extras.
"""
