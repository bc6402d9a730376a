"""``single_turn``: one generation per sample; every response token is the policy's."""

from __future__ import annotations

from rl_rollout.agent_loop.base import AgentInput, AgentLoop, AgentLoopOutput

__all__ = ["SingleTurnAgentLoop"]


class SingleTurnAgentLoop(AgentLoop):
    """Generate once (at most ``config.response_length`` tokens) and return the tokens."""

    async def run(self, sample: AgentInput) -> AgentLoopOutput:
        prompt_ids = self.prompt_ids(sample)
        out = await self.client.generate(
            prompt_ids, self.turn_params(sample, 0), sample.session_id, **sample.client_kwargs()
        )
        return AgentLoopOutput(
            prompt_ids=prompt_ids,
            response_ids=list(out.token_ids),
            response_mask=[1] * len(out.token_ids),
            response_log_probs=[float(x) for x in out.log_probs],
            finish_reason=out.finish_reason,
            num_turns=1,
            response_versions=None if out.weight_versions is None else list(out.weight_versions),
            routed_experts=out.routed_experts,
        )
