"""AgentTree: sub-agents with depth limits, permit lending, notification routes and residents.

Real pydantic-ai agents on its offline FunctionModel, and, where requests on the wire are
counted, its OpenAI model over the real openai SDK against the local fake provider.
"""

from __future__ import annotations

from functools import partial

import anyio
import anyio.to_thread
import openai
import pytest
from lovely_coordinator_limits.testing import FakeProvider
from lovely_coordinator_pydantic_ai import (
    AgentTree,
    ChildAgent,
    ChildDisposedError,
    ChildStoppedError,
    SpawnRefusedError,
    current_session,
)
from pydantic_ai import Agent, RunContext
from pydantic_ai.exceptions import ModelHTTPError, UsageLimitExceeded
from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.models.openai import OpenAIChatModel
from pydantic_ai.providers.openai import OpenAIProvider
from pydantic_ai.usage import UsageLimits

from lovely_coordinator import (
    AgentCoordinator,
    CoordinatorStatistics,
    InvalidArgumentError,
    ParentNotification,
    SessionContext,
    UsageError,
    create_agent_coordinator,
)

pytestmark = pytest.mark.anyio  # on asyncio alone: see conftest.py


def _tool_returns(messages: list[ModelMessage]) -> list[str]:
    last = messages[-1]
    if not isinstance(last, ModelRequest):
        return []
    return [str(p.content) for p in last.parts if isinstance(p, ToolReturnPart)]


def _delegating(tasks: list[str], tool: str = "delegate") -> FunctionModel:
    """A parent model: first asks for one tool call per task (in parallel), then reports."""

    def respond(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        returns = _tool_returns(messages)
        if returns:
            return ModelResponse(parts=[TextPart(" | ".join(sorted(returns)))])
        calls = [ToolCallPart(tool, {"task": task}) for task in tasks]
        return ModelResponse(parts=calls)

    return FunctionModel(respond, model_name="parent")


def _answering(name: str, probe: list[SessionContext | None] | None = None) -> FunctionModel:
    def respond(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        if probe is not None:
            probe.append(_context_now())
        prompts = [
            p.content
            for m in messages
            if isinstance(m, ModelRequest)
            for p in m.parts
            if p.part_kind == "user-prompt"
        ]
        return ModelResponse(parts=[TextPart(f"{name}:{prompts[-1]}#{len(prompts)}")])

    return FunctionModel(respond, model_name=name)


_coordinators: list[AgentCoordinator] = []


def _context_now() -> SessionContext | None:
    session = current_session()
    return _coordinators[-1].get_session_context(session) if session else None


def _coordinator(limit: int) -> AgentCoordinator:
    coordinator = create_agent_coordinator(limit)
    _coordinators.append(coordinator)
    return coordinator


async def test_a_tree_of_four_parents_and_eight_children_at_capacity_two() -> None:
    with anyio.fail_after(10):
        coordinator = _coordinator(2)
        observed: list[tuple[int, int]] = []

        def child_respond(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
            stats = coordinator.statistics()
            observed.append((stats.active, stats.lent))
            return ModelResponse(parts=[TextPart(f"done {current_session()}")])

        outputs: dict[str, str] = {}
        async with AgentTree(coordinator, max_depth=1) as tree:
            child = Agent(tree.wrap(FunctionModel(child_respond, model_name="child")))

            async def parent(session_id: str) -> None:
                agent = Agent(tree.wrap(_delegating(["a", "b"])), tools=[tree.tool(child)])
                outputs[session_id] = await tree.run(agent, "go", session_id=session_id)

            async with anyio.create_task_group() as tg:
                for n in range(4):
                    tg.start_soon(parent, f"p{n}")
        assert sorted(outputs) == ["p0", "p1", "p2", "p3"]
        for session_id, output in outputs.items():
            assert output.count(f"done {session_id}/") == 2
        assert len(observed) == 8
        # Never more than two slots in use; every child ran on a slot its parent lent.
        assert all(active <= 2 and lent >= 1 for active, lent in observed)
        stats = coordinator.statistics()
        assert (stats.active, stats.queued, stats.lent) == (0, 0, 0)
        assert tree.children() == ()


async def test_depth_limit_holds() -> None:
    with anyio.fail_after(10):
        coordinator = _coordinator(2)
        contexts: list[SessionContext | None] = []
        async with AgentTree(coordinator, max_depth=1) as tree:
            leaf = Agent(tree.wrap(_answering("leaf")))
            # A child that itself tries to delegate: at depth 1 with max_depth=1 it may not.
            middle = Agent(
                tree.wrap(_delegating(["deeper"], tool="delegate"), tuple=("function", "middle")),
                tools=[tree.tool(leaf)],
            )

            def root_respond(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
                contexts.append(_context_now())
                returns = _tool_returns(messages)
                if returns:
                    return ModelResponse(parts=[TextPart(returns[0])])
                return ModelResponse(parts=[ToolCallPart("delegate", {"task": "work"})])

            root = Agent(
                tree.wrap(FunctionModel(root_respond, model_name="root")),
                tools=[tree.tool(middle)],
            )
            output = await tree.run(root, "go", session_id="root")
        assert output == "Refused: Sub-agent depth limit reached (max_depth=1)"
        assert contexts[0] == SessionContext(0, True)


async def test_sessions_that_may_not_delegate_are_refused() -> None:
    with anyio.fail_after(10):
        coordinator = _coordinator(2)
        async with AgentTree(coordinator) as tree:
            child = Agent(tree.wrap(_answering("child")))
            root = Agent(tree.wrap(_delegating(["x"])), tools=[tree.tool(child)])
            output = await tree.run(root, "go", session_id="root", allow_agents=False)
            assert output == "Refused: Sub-agents are not allowed in this session"
            with pytest.raises(UsageError, match=r"^No session of this AgentTree"):
                tree.start(child, "outside any session")
        with pytest.raises(UsageError, match=r"^AgentTree is not running"):
            tree.start(child, "after exit")


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"max_depth": -1}, r"^max_depth must be a nonnegative integer$"),
        ({"max_depth": True}, r"^max_depth must be a nonnegative integer$"),
        ({"max_residents": -1}, r"^max_residents must be a nonnegative integer$"),
        ({"max_residents": 1.0}, r"^max_residents must be a nonnegative integer$"),
    ],
)
def test_limits_are_validated(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(InvalidArgumentError, match=message):
        AgentTree(create_agent_coordinator(1), **kwargs)  # type: ignore[arg-type]


async def test_child_sessions_have_parent_depth_plus_one() -> None:
    with anyio.fail_after(10):
        coordinator = _coordinator(2)
        contexts: list[SessionContext | None] = []
        async with AgentTree(coordinator, max_depth=3) as tree:
            child = Agent(tree.wrap(_answering("child", contexts)))
            root = Agent(tree.wrap(_delegating(["x"])), tools=[tree.tool(child, keep=True)])
            await tree.run(root, "go", session_id="root")
            (resident,) = tree.children()
            assert coordinator.get_resident(resident.session_id) is resident
        (context,) = contexts
        assert context is not None
        assert (context.depth, context.allow_agents) == (1, True)
        assert context.dispose is not None
        assert context.dispose.is_set()  # disposed when the tree exited
        assert coordinator.get_resident(resident.session_id) is None
        assert coordinator.get_session_context(resident.session_id) is None


async def test_a_child_hitting_a_limit_closes_its_tuple_while_siblings_continue() -> None:
    def limited(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        raise ModelHTTPError(429, "busy", {"error": "rate limit"}, headers={"retry-after": "60"})

    with anyio.fail_after(10):
        coordinator = _coordinator(2)
        async with AgentTree(coordinator) as tree:
            # One attempt: the limit reaches the child (the model does not wait out 60 s).
            failing = Agent(tree.wrap(FunctionModel(limited, model_name="busy"), max_attempts=1))
            working = Agent(tree.wrap(_answering("calm")))
            root = Agent(
                tree.wrap(_two_tools()),
                tools=[tree.tool(failing, name="busy"), tree.tool(working, name="calm")],
            )
            output = await tree.run(root, "go", session_id="root")
        assert "The sub-agent failed: ModelHTTPError" in output
        assert "calm:b#1" in output
        assert not coordinator.is_tuple_open(("function", "busy"))
        assert coordinator.is_tuple_open(("function", "calm"))
        state = tree.handler.state(("function", "busy"))
        assert state is not None
        assert state.failures == 1


def _two_tools() -> FunctionModel:
    def respond(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        returns = _tool_returns(messages)
        if returns:
            return ModelResponse(parts=[TextPart(" | ".join(sorted(returns)))])
        calls = [ToolCallPart("busy", {"task": "a"}), ToolCallPart("calm", {"task": "b"})]
        return ModelResponse(parts=calls)

    return FunctionModel(respond, model_name="parent")


async def test_detached_results_and_follow_ups_arrive_by_notification() -> None:
    with anyio.fail_after(10):
        coordinator = _coordinator(2)
        received: list[ParentNotification] = []
        arrived = anyio.Event()
        follow_up = anyio.Event()

        async def route(notification: ParentNotification) -> None:
            received.append(notification)
            (follow_up if arrived.is_set() else arrived).set()

        unbind = coordinator.bind_notification_route("root", route)
        started: list[ChildAgent[str]] = []
        async with AgentTree(coordinator) as tree:
            child = Agent(tree.wrap(_answering("child")))

            def root_respond(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
                if _tool_returns(messages):
                    return ModelResponse(parts=[TextPart("started")])
                return ModelResponse(parts=[ToolCallPart("start", {"task": "first"})])

            root = Agent(tree.wrap(FunctionModel(root_respond, model_name="root")))

            @root.tool_plain
            async def start(task: str) -> str:  # async: pydantic-ai runs sync tools in threads
                started.append(tree.start(child, task))
                return started[-1].session_id

            assert await tree.run(root, "go", session_id="root") == "started"
            await arrived.wait()
            (resident,) = started
            assert received == [
                ParentNotification(f"{resident.session_id}#1", resident.session_id, "child:first#1")
            ]
            # A follow-up through the registry reaches the resident child, which answers with
            # its conversation so far (second prompt).
            found = coordinator.get_resident(resident.session_id)
            assert found is resident
            resident.input("second", "followup")
            await follow_up.wait()
            assert received[1].content == "child:second#2"
            assert received[1].id == f"{resident.session_id}#2"
        unbind()
        assert coordinator.statistics().active == 0


async def test_stopping_a_child_fails_its_waiting_parent() -> None:
    with anyio.fail_after(10):
        coordinator = _coordinator(2)
        entered = anyio.Event()

        async def stuck(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
            entered.set()
            await anyio.sleep_forever()
            raise AssertionError("unreachable")

        outcome: list[BaseException] = []
        async with AgentTree(coordinator) as tree:
            child = Agent(tree.wrap(FunctionModel(stuck, model_name="stuck")))
            root = Agent(tree.wrap(_delegating(["t"], tool="ask")))

            @root.tool_plain
            async def ask(task: str) -> str:
                try:
                    return str(await tree.ask(child, task))
                except ChildStoppedError as exc:
                    outcome.append(exc)
                    return "stopped"

            async with anyio.create_task_group() as tg:
                tg.start_soon(partial(tree.run, root, "go", session_id="root"))
                await entered.wait()
                (resident,) = tree.children()
                assert coordinator.statistics().lent == 1
                resident.stop()
            assert len(outcome) == 1
            assert resident.turns == 1
            # Not kept: disposed once its parent's run ended.
            assert resident.dispose_event.is_set()
            assert coordinator.get_resident(resident.session_id) is None
        assert coordinator.statistics().active == 0


def _starter(
    tree: AgentTree, child: Agent[None, str], started: list[ChildAgent[str]]
) -> Agent[None, str]:
    """A root agent that starts one detached child and answers 'started'."""

    def respond(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        if _tool_returns(messages):
            return ModelResponse(parts=[TextPart("started")])
        return ModelResponse(parts=[ToolCallPart("start", {"task": "job"})])

    root = Agent(tree.wrap(FunctionModel(respond, model_name="root")))

    @root.tool_plain
    async def start(task: str) -> str:
        started.append(tree.start(child, task))
        return started[-1].session_id

    return root


async def test_results_without_a_route_are_kept_and_a_broken_route_is_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with anyio.fail_after(10):
        coordinator = _coordinator(2)
        started: list[ChildAgent[str]] = []
        async with AgentTree(coordinator) as tree:
            child = Agent(tree.wrap(_answering("child")))
            await tree.run(_starter(tree, child, started), "go", session_id="no-route")
            await started[0].result()
            await anyio.wait_all_tasks_blocked()
            (kept,) = tree.undelivered()
            assert (kept.task_ref, kept.content) == (started[0].session_id, "child:job#1")

            broken_called = anyio.Event()

            def broken(notification: ParentNotification) -> None:
                broken_called.set()
                raise RuntimeError("the UI is gone")

            unbind = coordinator.bind_notification_route("broken", broken)
            await tree.run(_starter(tree, child, started), "go", session_id="broken")
            await broken_called.wait()
            await anyio.wait_all_tasks_blocked()
            unbind()
            # The child survived its parent's broken route and still takes follow-ups.
            assert started[1].dispose_event.is_set() is False
        assert "notification route of broken failed" in caplog.text


async def test_a_child_disposed_before_it_starts_never_runs() -> None:
    with anyio.fail_after(10):
        coordinator = _coordinator(2)
        calls: list[SessionContext | None] = []
        started: list[ChildAgent[str]] = []
        async with AgentTree(coordinator) as tree:
            child = Agent(tree.wrap(_answering("child", calls)))

            def respond(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
                if _tool_returns(messages):
                    return ModelResponse(parts=[TextPart("done")])
                return ModelResponse(parts=[ToolCallPart("start_and_drop", {"task": "never"})])

            root = Agent(tree.wrap(FunctionModel(respond, model_name="root")))

            @root.tool_plain
            async def start_and_drop(task: str) -> str:
                started.append(tree.start(child, task))
                started[-1].dispose()  # before its task has had a chance to run
                return "dropped"

            assert await tree.run(root, "go", session_id="root") == "done"
            (dropped,) = started
            with pytest.raises(ChildStoppedError, match=r"^Sub-agent was disposed before"):
                await dropped.result()
            assert coordinator.get_resident(dropped.session_id) is None
            with pytest.raises(ChildDisposedError, match=r"^Sub-agent has been disposed$"):
                dropped.input("too late")
        assert calls == []
        assert coordinator.statistics().active == 0


# --- the user-found bugs of issue 11 (4): exceptions, misuse, residents, typing -----------


@pytest.mark.parametrize("with_a_child", [False, True])
async def test_the_body_exception_leaves_the_tree_unwrapped(with_a_child: bool) -> None:
    """Regression: the tree's task group wrapped it in an ExceptionGroup."""
    with anyio.fail_after(10):
        coordinator = _coordinator(2)
        started: list[ChildAgent[str]] = []

        async def body() -> None:
            async with AgentTree(coordinator) as tree:
                if with_a_child:
                    child = Agent(tree.wrap(_answering("child")))
                    await tree.run(_starter(tree, child, started), "go", session_id="root")
                raise LookupError("from the body")

        with pytest.raises(LookupError, match=r"^from the body$") as caught:
            await body()
        assert type(caught.value) is LookupError
        assert all(child.dispose_event.is_set() for child in started)
        assert coordinator.statistics().active == 0


async def test_run_without_async_with_is_a_usage_error() -> None:
    """Regression: the misuse reached the model as a tool result ("Refused: ...")."""
    with anyio.fail_after(10):
        coordinator = _coordinator(2)
        calls: list[SessionContext | None] = []
        tree = AgentTree(coordinator)
        child = Agent(tree.wrap(_answering("child")))
        root = Agent(tree.wrap(_delegating(["x"])), tools=[tree.tool(child)])
        with pytest.raises(UsageError, match=r"^AgentTree is not running: use it as "):
            await tree.run(root, "go", session_id="root")
        # The tool of a tree that is not running raises too, out of the agent's own run.
        with pytest.raises(UsageError, match=r"^AgentTree is not running"):
            await root.run("go")
        assert calls == []
        assert coordinator.get_session_context("root") is None
        async with tree:
            with pytest.raises(UsageError, match=r"^This AgentTree has already been entered$"):
                await tree.__aenter__()


async def test_children_that_were_not_kept_go_when_their_parent_run_ends() -> None:
    """Regression: finished sub-agents stayed resident until the tree exited (40 residents
    after 20 runs)."""
    with anyio.fail_after(30):
        coordinator = _coordinator(2)
        async with AgentTree(coordinator) as tree:
            child = Agent(tree.wrap(_answering("child")))
            root = Agent(tree.wrap(_delegating(["a", "b"])), tools=[tree.tool(child)])
            for n in range(20):
                output = await tree.run(root, "go", session_id=f"root-{n}")
                assert output == "child:a#1 | child:b#1"
                assert tree.children() == ()
                assert coordinator.get_resident(f"root-{n}/{2 * n + 1}") is None
                assert coordinator.get_session_context(f"root-{n}/{2 * n + 2}") is None
        assert coordinator.statistics().residents == 0


async def test_grandchildren_go_when_their_parent_turn_ends() -> None:
    with anyio.fail_after(10):
        coordinator = _coordinator(3)
        async with AgentTree(coordinator, max_depth=2) as tree:
            leaf = Agent(tree.wrap(_answering("leaf")))
            middle = Agent(
                tree.wrap(_delegating(["deeper"]), tuple=("function", "middle")),
                tools=[tree.tool(leaf)],
            )
            root = Agent(tree.wrap(_delegating(["work"])), tools=[tree.tool(middle, keep=True)])
            assert await tree.run(root, "go", session_id="root") == "leaf:deeper#1"
            (kept,) = tree.children()  # the middle child was kept, its own child was not
            assert kept.session_id == "root/1"
            assert coordinator.get_resident("root/1/2") is None


async def test_kept_children_are_bounded() -> None:
    with anyio.fail_after(10):
        coordinator = _coordinator(4)
        started: list[ChildAgent[str]] = []
        release = anyio.Event()

        async def slow(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
            await release.wait()
            return ModelResponse(parts=[TextPart("slow done")])

        async with AgentTree(coordinator, max_residents=2) as tree:
            quick = Agent(tree.wrap(_answering("quick")))
            for n in range(3):
                await tree.run(_starter(tree, quick, started), "go", session_id=f"r{n}")
                await started[-1].result()
                await anyio.wait_all_tasks_blocked()
            # The third kept child made room by disposing the least recently used idle one.
            assert [c.dispose_event.is_set() for c in started] == [True, False, False]
            assert [c.session_id for c in tree.children()] == ["r1/2", "r2/3"]
            busy = Agent(tree.wrap(FunctionModel(slow, model_name="slow")))
            started.clear()
            await tree.run(_starter(tree, busy, started), "go", session_id="s0")
            await tree.run(_starter(tree, busy, started), "go", session_id="s1")
            # Both residents are busy now: nothing can make room.
            with pytest.raises(SpawnRefusedError, match=r"^Too many resident sub-agents"):
                await tree.run(_starter(tree, busy, started), "go", session_id="s2")
            release.set()
        assert len(started) == 2


async def test_a_kept_child_yet_to_answer_is_not_disposed_to_make_room() -> None:
    """Regression: a kept child counted as idle until its task began its first turn, so a
    second ``start`` right after the first disposed it unanswered (at max_residents=1)."""
    with anyio.fail_after(10):
        coordinator = _coordinator(4)
        started: list[ChildAgent[str]] = []
        refusals: list[str] = []
        async with AgentTree(coordinator, max_residents=1) as tree:
            quick = Agent(tree.wrap(_answering("quick")))

            def respond(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
                if _tool_returns(messages):
                    return ModelResponse(parts=[TextPart("started")])
                return ModelResponse(parts=[ToolCallPart("start", {"task": "job"})])

            root = Agent(tree.wrap(FunctionModel(respond, model_name="root")))

            @root.tool_plain
            async def start(task: str) -> str:
                started.append(tree.start(quick, "one"))
                try:
                    started.append(tree.start(quick, "two"))
                except SpawnRefusedError as exc:
                    refusals.append(str(exc))
                return "ok"

            assert await tree.run(root, "go", session_id="r") == "started"
            assert await started[0].result() == "quick:one#1"
            assert len(started) == 1
            assert refusals == ["Too many resident sub-agents are busy (max_residents=1)"]
            # Once it has answered it is idle, and makes room for the next one.
            await anyio.wait_all_tasks_blocked()
            assert await tree.run(root, "go", session_id="r2") == "started"
            assert started[0].dispose_event.is_set()
            assert await started[1].result() == "quick:one#1"


async def test_run_is_typed_and_passes_deps_limits_and_settings() -> None:
    with anyio.fail_after(10):
        coordinator = _coordinator(2)
        seen: list[object] = []

        def respond(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
            seen.append(info.model_settings)
            returns = _tool_returns(messages)
            if returns:
                return ModelResponse(parts=[ToolCallPart("final_result", {"response": 42})])
            return ModelResponse(parts=[ToolCallPart("lookup", {})])

        async with AgentTree(coordinator) as tree:
            agent = Agent(
                tree.wrap(FunctionModel(respond, model_name="typed")),
                deps_type=str,
                output_type=int,
            )

            @agent.tool
            async def lookup(ctx: RunContext[str]) -> str:
                return ctx.deps

            answer: int = await tree.run(
                agent,
                "go",
                session_id="typed",
                deps="the deps",
                model_settings={"temperature": 0.25},
                usage_limits=UsageLimits(request_limit=5),
            )
            assert answer == 42
            assert seen[0] == {"temperature": 0.25}
            with pytest.raises(UsageLimitExceeded):
                await tree.run(
                    agent,
                    "go",
                    session_id="limited",
                    deps="x",
                    usage_limits=UsageLimits(request_limit=1),
                )


async def test_delegating_tools_stay_within_the_cap(
    fake_provider: FakeProvider, fake_provider_url: str
) -> None:
    """Regression (issue 11, bug 1): pydantic-ai's own delegation pattern — a tool that
    awaits a child agent — put four requests in flight at max_concurrency=2, every child
    treating the parent's inherited permit as cover."""
    with anyio.fail_after(20):
        coordinator = _coordinator(2)
        fake_provider.pause("gpt-child")
        client = openai.AsyncOpenAI(
            base_url=f"{fake_provider_url}/v1", api_key="local", max_retries=0
        )
        async with client, AgentTree(coordinator) as tree:
            chat = OpenAIChatModel("gpt-child", provider=OpenAIProvider(openai_client=client))
            child = Agent(tree.wrap(chat))
            parent = Agent(tree.wrap(_delegating(["a", "b", "c", "d"], tool="research")))

            @parent.tool_plain
            async def research(task: str) -> str:
                return (await child.run(task)).output

            async with anyio.create_task_group() as tg:
                tg.start_soon(partial(tree.run, parent, "go", session_id="root"))
                # The parent's permit covers one child's call, the free slot another; two wait.
                await anyio.to_thread.run_sync(fake_provider.wait_for_in_flight, "gpt-child", 2)
                await _until_queued(coordinator, 2)
                assert fake_provider.in_flight("gpt-child") == 2
                fake_provider.resume("gpt-child")
        assert fake_provider.peak_in_flight("gpt-child") == 2
        assert len(fake_provider.seen("gpt-child")) == 4
        stats = coordinator.statistics()
        assert (stats.active, stats.queued) == (0, 0)


async def _until_queued(coordinator: AgentCoordinator, count: int) -> None:
    ready = anyio.Event()

    def check(snapshot: CoordinatorStatistics) -> None:
        if snapshot.queued >= count:
            ready.set()

    unsubscribe = coordinator.subscribe(check)
    try:
        if coordinator.statistics().queued < count:
            await ready.wait()
    finally:
        unsubscribe()
