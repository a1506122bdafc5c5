"""Topic layout of a deployment; every role publishes and subscribes only where its role allows.

shufflekit/{deployment}/announce                       retained round announcement
shufflekit/{deployment}/round/{round}/hop/{i}/data     input of hop i (i = 0: client ingest;
shufflekit/{deployment}/round/{round}/hop/{i}/manifest   i = L: the analyzer)
shufflekit/{deployment}/round/{round}/close            coordinator: stop accepting, release
shufflekit/{deployment}/round/{round}/abort            a hop released nothing
shufflekit/{deployment}/round/{round}/result           the analyzer's published result
shufflekit/{deployment}/round/{round}/go-request       a mix -> coordinator: may I forward?
shufflekit/{deployment}/round/{round}/go               coordinator -> mixes: the answer

The coordinator's readiness handshake adds two (`RoundTopics` in shufflekit/app/rounds.py):

shufflekit/{deployment}/prepare                        coordinator -> hops: the coming round
shufflekit/{deployment}/round/{round}/ready            hops -> coordinator: subscribed, key ok
"""

from __future__ import annotations

from shufflekit.base.names import check_name

__all__ = ["Topics", "check_name"]


class Topics:
    """The topic names of one deployment."""

    def __init__(self, deployment: str) -> None:
        self.deployment = check_name("deployment", deployment)
        self.prefix = f"shufflekit/{deployment}"

    @property
    def announce(self) -> str:
        return f"{self.prefix}/announce"

    def _round(self, round_id: str) -> str:
        return f"{self.prefix}/round/{check_name('round id', round_id)}"

    def data(self, round_id: str, hop: int) -> str:
        return f"{self._round(round_id)}/hop/{hop}/data"

    def manifest(self, round_id: str, hop: int) -> str:
        return f"{self._round(round_id)}/hop/{hop}/manifest"

    def close(self, round_id: str) -> str:
        return f"{self._round(round_id)}/close"

    def abort(self, round_id: str) -> str:
        return f"{self._round(round_id)}/abort"

    def result(self, round_id: str) -> str:
        return f"{self._round(round_id)}/result"

    def go_request(self, round_id: str) -> str:
        return f"{self._round(round_id)}/go-request"

    def go(self, round_id: str) -> str:
        return f"{self._round(round_id)}/go"
