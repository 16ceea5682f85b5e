------------------------------ MODULE MirroredSampledIds ------------------------------
(***************************************************************************************)
(* Device-mirrored sampled token ids for async (depth-2) scheduling on Tenstorrent.     *)
(*                                                                                     *)
(* The TLA+ twin of ttmirror's Python model (model/state.py, model/actions.py,          *)
(* model/invariants.py). Every variable, action and invariant below has a namesake      *)
(* there, and `ttmirror tlc` checks that both encodings reach the same states, give     *)
(* the same verdicts and draw the same state graph.                                     *)
(*                                                                                     *)
(* Encoding shared with Python: requests and slots are numbered from 0, as are rows in  *)
(* prev_row; the in-flight queue is a sequence (its position q is 1-based here and      *)
(* 0-based in Python). -1 stands for Python's None in prev_row, src_slot and closed_at; *)
(* <<>> stands for None in consumed and host_copy; a slot's content is <<>> and         *)
(* written = FALSE when never written (Python: None), <<>> and written = TRUE once      *)
(* released (Python: ()). A token is <<req, pos>>.                                      *)
(***************************************************************************************)
EXTENDS Integers, Sequences, FiniteSets

CONSTANTS
    Depth,          \* D = max_concurrent_batches: 1 (sync), 2 (async) or 3
    Slots,          \* K: mirror buffers in the ring; step n writes slot n mod K
    Requests,       \* number of requests
    MaxTokens,      \* tokens each request generates before it finishes on its own
    Preemptions,    \* how often each request may be preempted
    Finish,         \* stop tokens: early finish, known only after readback
    Abort,          \* user aborts
    Preempt,        \* preemption
    Condense,       \* rows may be placed in any order
    Guard,          \* the stale-host-ids guard
    ReleaseAtIssue, \* known-bad: a slot is released once its readback is issued
    PreemptKeep,    \* preempted requests keep their in-flight tokens (vLLM's policy), else drop
    PrefillChunks,  \* chunks of each first prefill; all but the last are partial rows
    HostSync,       \* request 0 needs its newest token on the host before its next step
    ResumeWithPlaceholder,  \* known-bad: resume while an in-flight token is still owed (keep)
    PartialFeedsMirror,     \* known-bad: a partial-prefill row feeds the previous-row map
    HostSyncUnguarded,      \* known-bad: the host-sync request is scheduled while in flight
    Faults,                 \* the device may fail a step before its readback completes
    FaultSparesLaterRows    \* known-bad: a fault leaves its failed requests' other rows live

Req == 0 .. Requests - 1
SlotIds == 0 .. Slots - 1

\* Phases of a step and statuses of a request, numbered as in model/state.py.
SCHEDULED == 0
COMBINED == 1
LAUNCHED == 2
READBACK_ISSUED == 3
READBACK_DONE == 4

ABSENT == 0
WAITING == 1
RUNNING == 2
PREEMPTED == 3
FINISHED == 4
ABORTED == 5
FAILED == 6

Closed == {FINISHED, ABORTED, FAILED}   \* Python: CLOSED

PLACEHOLDER == <<-1, -1>>   \* the host table at a position still on the device
GARBAGE == <<-2, -2>>       \* a read of an unwritten or released slot
NONE == -1

READ_RELEASED == "NoReadOfReleasedOrOverwrittenSlot"
REWRITE_WITH_READER == "NoRewriteWhileReaderOutstanding"

\* A dropped row: its token is never delivered nor read, so what it held is forgotten.
DeadRow == [req |-> NONE, pos |-> 0, prev_row |-> NONE, consumed |-> <<>>, live |-> FALSE,
            partial |-> FALSE]

VARIABLES
    allocated,  \* the ring exists (allocated at load, before any trace capture)
    next_slot,  \* the slot the next scheduled step takes
    queue,      \* in-flight steps, oldest first: [slot, src_slot, phase, rows, host_copy]
    slots,      \* per slot: [written, content, released]
    requests,   \* per request: [status, delivered, closed_at, unchecked, preemptions,
                \*               prefill_left]
    broken      \* ghost: the slot rules an access broke at the moment it happened

vars == <<allocated, next_slot, queue, slots, requests, broken>>

---------------------------------------------------------------------------------------
(* Type invariant. *)

Token == (Req \X (0 .. MaxTokens)) \cup {PLACEHOLDER, GARBAGE}
Row == [req: Req \cup {NONE}, pos: 0 .. MaxTokens, prev_row: (0 .. Requests - 1) \cup {NONE},
        consumed: Token \cup {<<>>}, live: BOOLEAN, partial: BOOLEAN]

TypeOK ==
    /\ allocated \in BOOLEAN
    /\ next_slot \in SlotIds
    /\ Len(queue) <= Depth
    /\ \A q \in 1 .. Len(queue) :
          /\ queue[q].slot \in SlotIds
          /\ queue[q].src_slot \in SlotIds \cup {NONE}
          /\ queue[q].phase \in SCHEDULED .. READBACK_DONE
          /\ \A i \in 1 .. Len(queue[q].rows) : queue[q].rows[i] \in Row
    /\ \A k \in SlotIds : slots[k].written \in BOOLEAN /\ slots[k].released \in BOOLEAN
    /\ \A r \in Req :
          /\ requests[r].status \in ABSENT .. FAILED
          /\ Len(requests[r].delivered) <= MaxTokens
          /\ requests[r].preemptions \in 0 .. Preemptions
          /\ requests[r].prefill_left \in 0 .. PrefillChunks - 1
    /\ broken \subseteq {READ_RELEASED, REWRITE_WITH_READER}

---------------------------------------------------------------------------------------
(* Derived values (Python: the operators at the top of model/actions.py). *)

RowIds(q) == 1 .. Len(queue[q].rows)

\* In-flight rows of r whose token will be delivered (its placeholders).
LiveCount(r) ==
    Cardinality({qi \in (1 .. Len(queue)) \X (1 .. Requests) :
                    /\ qi[2] \in RowIds(qi[1])
                    /\ queue[qi[1]].rows[qi[2]].live
                    /\ ~queue[qi[1]].rows[qi[2]].partial
                    /\ queue[qi[1]].rows[qi[2]].req = r})

\* Some in-flight step holds a live row of r, partial-prefill rows included.
HasStepInFlight(r) ==
    \E q \in 1 .. Len(queue) : \E i \in RowIds(q) :
        queue[q].rows[i].live /\ queue[q].rows[i].req = r

\* r needs its newest token on the host before its next step.
IsHostSync(r) == HostSync /\ r = 0

\* Position of r's newest token: delivered ones plus those still in flight.
NextPos(r) == Len(requests[r].delivered) + LiveCount(r)

\* The host token table at pos: authoritative if delivered, else a placeholder.
HostToken(r, pos) ==
    IF pos = 0 THEN <<r, 0>>
    ELSE IF pos <= Len(requests[r].delivered) THEN requests[r].delivered[pos]
    ELSE PLACEHOLDER

\* Requests the scheduler must put in the next step: active with budget left.
Eligible == {r \in Req : /\ requests[r].status \in {WAITING, RUNNING}
                         /\ NextPos(r) < MaxTokens
                         /\ ~(IsHostSync(r) /\ HasStepInFlight(r) /\ ~HostSyncUnguarded)}

\* Every order of a set of requests, and the ascending one.
Orders(S) == {f \in [1 .. Cardinality(S) -> S] : \A i, j \in DOMAIN f : i # j => f[i] # f[j]}
Ascending(f) == \A i, j \in DOMAIN f : i < j => f[i] < f[j]
Range(f) == {f[i] : i \in DOMAIN f}

\* Queue position of the in-flight step whose launch wrote slot k last; 0 if retired.
WriterSet(k) == {q \in 1 .. Len(queue) : queue[q].slot = k /\ queue[q].phase >= LAUNCHED}
Writer(k) == IF WriterSet(k) = {} THEN 0 ELSE CHOOSE q \in WriterSet(k) : \A p \in WriterSet(k) : p <= q

\* Someone still has to read what slot k holds before step q overwrites it.
ReadersOutstanding(k, q) ==
    \E j \in 1 .. Len(queue) :
        \/ queue[j].slot = k /\ LAUNCHED <= queue[j].phase /\ queue[j].phase < READBACK_DONE
        \/ j # q + 1 /\ queue[j].src_slot = k /\ queue[j].phase = SCHEDULED

\* What the device reads from slot k at row (0-based): garbage if unwritten or released.
ReadSlot(k, row) ==
    IF ~slots[k].written \/ slots[k].released \/ row >= Len(slots[k].content) THEN GARBAGE
    ELSE slots[k].content[row + 1]

\* Forget the tokens of the requests in R: nothing reads them again once their rows drop.
Scrub(R, ts) == [i \in 1 .. Len(ts) |-> IF ts[i][1] \in R THEN GARBAGE ELSE ts[i]]

\* Drop every in-flight row of the requests in R and forget their tokens in host copies and
\* slots (Python: _drop, once per request).
DropQueue(R) ==
    [q \in 1 .. Len(queue) |->
        [queue[q] EXCEPT
            !.rows = [i \in RowIds(q) |-> IF queue[q].rows[i].req \in R THEN DeadRow
                                           ELSE queue[q].rows[i]],
            !.host_copy = Scrub(R, queue[q].host_copy)]]
DropSlots(R) == [k \in SlotIds |-> [slots[k] EXCEPT !.content = Scrub(R, slots[k].content)]]

\* Rows of step q whose sampled id is r's newest token for a later combine to read through the
\* previous-row map: live, and not a partial prefill's discarded id (Python: mirror_rows).
MirrorRows(q, r) ==
    {i \in RowIds(q) : /\ queue[q].rows[i].live /\ queue[q].rows[i].req = r
                       /\ (PartialFeedsMirror \/ ~queue[q].rows[i].partial)}

\* The row of r in the previous (newest) in-flight step, if live there: the previous-row map.
\* Arrived, resumed and host-sync requests take host ids; a partial row is never mirrored.
PrevRow(r) ==
    IF ~Guard \/ queue = <<>> \/ requests[r].status = WAITING \/ IsHostSync(r) THEN NONE
    ELSE LET hits == MirrorRows(Len(queue), r)
         IN IF hits = {} THEN NONE ELSE (CHOOSE i \in hits : TRUE) - 1

---------------------------------------------------------------------------------------
(* Actions, one definition each (Python: model/actions.py). *)

Init ==
    /\ allocated = FALSE
    /\ next_slot = 0
    /\ queue = <<>>
    /\ slots = [k \in SlotIds |-> [written |-> FALSE, content |-> <<>>, released |-> FALSE]]
    /\ requests = [r \in Req |-> [status |-> ABSENT, delivered |-> <<>>, closed_at |-> NONE,
                                  unchecked |-> FALSE, preemptions |-> 0,
                                  prefill_left |-> PrefillChunks - 1]]
    /\ broken = {}

\* Load: allocate the ring of K mirror slots, before any step (and so any trace capture).
Allocate ==
    /\ ~allocated
    /\ allocated' = TRUE
    /\ UNCHANGED <<next_slot, queue, slots, requests, broken>>

\* A request arrives; its first step prefills from host ids.
Arrive(r) ==
    /\ allocated
    /\ requests[r].status = ABSENT
    /\ requests' = [requests EXCEPT ![r].status = WAITING]
    /\ UNCHANGED <<allocated, next_slot, queue, slots, broken>>

\* Schedule a step over every eligible request in some order, building the previous-row map.
Schedule ==
    /\ allocated
    /\ Len(queue) < Depth
    /\ Eligible # {}
    /\ \E order \in Orders(Eligible) :
        /\ Condense \/ Ascending(order)
        /\ LET rows == [i \in DOMAIN order |->
                          [req |-> order[i], pos |-> NextPos(order[i]),
                           prev_row |-> PrevRow(order[i]), consumed |-> <<>>, live |-> TRUE,
                           partial |-> requests[order[i]].prefill_left > 0]]
               mirror == \E i \in DOMAIN rows : rows[i].prev_row # NONE
               step == [slot |-> next_slot,
                        src_slot |-> IF mirror THEN queue[Len(queue)].slot ELSE NONE,
                        phase |-> SCHEDULED, rows |-> rows, host_copy |-> <<>>]
           IN /\ queue' = Append(queue, step)
              /\ next_slot' = (next_slot + 1) % Slots
              /\ requests' = [r \in Req |->
                                IF r \in Range(order)
                                THEN [requests[r] EXCEPT !.status = RUNNING, !.unchecked = FALSE,
                                        !.prefill_left = IF @ > 0 THEN @ - 1 ELSE 0]
                                ELSE requests[r]]
    /\ UNCHANGED <<allocated, slots, broken>>

\* Build step q's input ids on device: host ids, or the previous slot through the row map.
Combine(q) ==
    /\ q <= Len(queue)
    /\ queue[q].phase = SCHEDULED
    /\ IF q = 1 THEN TRUE ELSE queue[q - 1].phase >= LAUNCHED  \* previous slot written
    /\ LET st == queue[q]
           Value(row) == IF row.prev_row = NONE THEN HostToken(row.req, row.pos)
                         ELSE ReadSlot(st.src_slot, row.prev_row)
           rows == [i \in RowIds(q) |-> IF ~st.rows[i].live THEN st.rows[i]
                                        ELSE [st.rows[i] EXCEPT !.consumed = Value(st.rows[i])]]
           mirror == \E i \in RowIds(q) : st.rows[i].live /\ st.rows[i].prev_row # NONE
       IN /\ queue' = [queue EXCEPT ![q] = [st EXCEPT !.phase = COMBINED, !.rows = rows]]
          /\ broken' = IF mirror /\ slots[st.src_slot].released
                       THEN broken \cup {READ_RELEASED} ELSE broken
    /\ UNCHANGED <<allocated, next_slot, slots, requests>>

\* Run step q's forward and sampler; the sampler writes its tokens into the step's slot.
Launch(q) ==
    /\ q <= Len(queue)
    /\ queue[q].phase = COMBINED
    /\ LET st == queue[q]
           Sampled(row) == IF row.live /\ ~row.partial /\ row.consumed = <<row.req, row.pos>>
                        THEN <<row.req, row.pos + 1>> ELSE GARBAGE
       IN /\ broken' = IF ReadersOutstanding(st.slot, q)
                       THEN broken \cup {REWRITE_WITH_READER} ELSE broken
          /\ slots' = [slots EXCEPT ![st.slot] =
                          [written |-> TRUE, released |-> FALSE,
                           content |-> [i \in RowIds(q) |-> Sampled(st.rows[i])]]]
          /\ queue' = [queue EXCEPT ![q].phase = LAUNCHED]
    /\ UNCHANGED <<allocated, next_slot, requests>>

\* Enqueue the non-blocking copy of step q's slot to a host tensor, and its event.
ReadbackIssue(q) ==
    /\ q <= Len(queue)
    /\ queue[q].phase = LAUNCHED
    /\ queue' = [queue EXCEPT ![q].phase = READBACK_ISSUED]
    /\ UNCHANGED <<allocated, next_slot, slots, requests, broken>>

\* Step q's readback event completes: the host tensor now holds the slot's content.
ReadbackComplete(q) ==
    /\ q <= Len(queue)
    /\ queue[q].phase = READBACK_ISSUED
    /\ LET st == queue[q]
       IN /\ queue' = [queue EXCEPT ![q] =
                         [st EXCEPT !.phase = READBACK_DONE,
                                    !.host_copy = [i \in RowIds(q) |-> ReadSlot(st.slot, i - 1)]]]
          /\ broken' = IF slots[st.slot].released \/ Writer(st.slot) # q
                       THEN broken \cup {READ_RELEASED} ELSE broken
    /\ UNCHANGED <<allocated, next_slot, slots, requests>>

\* Retire the oldest step: deliver each live row's token; max tokens finishes a request.
Apply ==
    /\ queue # <<>>
    /\ queue[1].phase = READBACK_DONE
    /\ LET st == queue[1]
           Hits(r) == {i \in RowIds(1) :
                         st.rows[i].live /\ ~st.rows[i].partial /\ st.rows[i].req = r}
           Deliver(r) ==
               LET d == Append(requests[r].delivered, st.host_copy[CHOOSE i \in Hits(r) : TRUE])
               IN IF Len(d) >= MaxTokens
                  THEN [requests[r] EXCEPT !.status = FINISHED, !.delivered = d,
                                           !.closed_at = Len(d), !.unchecked = FALSE]
                  ELSE [requests[r] EXCEPT !.delivered = d, !.unchecked = TRUE]
       IN requests' = [r \in Req |-> IF Hits(r) = {} THEN requests[r] ELSE Deliver(r)]
    /\ queue' = Tail(queue)
    /\ UNCHANGED <<allocated, next_slot, slots, broken>>

\* Hand a slot back: its readback is done and no combine will read it again.
Release(k) ==
    /\ allocated
    /\ slots[k].written
    /\ ~slots[k].released
    /\ IF ReleaseAtIssue
       THEN IF Writer(k) = 0 THEN TRUE ELSE queue[Writer(k)].phase >= READBACK_ISSUED
       ELSE /\ Writer(k) = 0
            /\ ~\E j \in 1 .. Len(queue) : queue[j].src_slot = k /\ queue[j].phase = SCHEDULED
    /\ slots' = [slots EXCEPT ![k] = [written |-> TRUE, content |-> <<>>, released |-> TRUE]]
    /\ UNCHANGED <<allocated, next_slot, queue, requests, broken>>

\* The newest delivered token was a stop token: the request finishes, in-flight rows drop.
FinishReq(r) ==
    /\ Finish
    /\ requests[r].status \notin Closed
    /\ requests[r].unchecked
    /\ queue' = DropQueue({r})
    /\ slots' = DropSlots({r})
    /\ requests' = [requests EXCEPT ![r].status = FINISHED,
                                    ![r].closed_at = Len(requests[r].delivered),
                                    ![r].unchecked = FALSE]
    /\ UNCHANGED <<allocated, next_slot, broken>>

\* The user aborts the request: nothing more is delivered, in-flight rows drop.
AbortReq(r) ==
    /\ Abort
    /\ requests[r].status \in {WAITING, RUNNING, PREEMPTED}
    /\ queue' = DropQueue({r})
    /\ slots' = DropSlots({r})
    /\ requests' = [requests EXCEPT ![r].status = ABORTED,
                                    ![r].closed_at = Len(requests[r].delivered),
                                    ![r].unchecked = FALSE]
    /\ UNCHANGED <<allocated, next_slot, broken>>

\* The KV budget is exceeded: the request is preempted; its in-flight tokens are kept and
\* delivered (PreemptKeep), or dropped. It will prefill again in one step.
PreemptReq(r) ==
    /\ Preempt
    /\ requests[r].status = RUNNING
    /\ requests[r].preemptions < Preemptions
    /\ queue' = IF PreemptKeep THEN queue ELSE DropQueue({r})
    /\ slots' = IF PreemptKeep THEN slots ELSE DropSlots({r})
    /\ requests' = [requests EXCEPT ![r].status = PREEMPTED, ![r].unchecked = FALSE,
                                    ![r].preemptions = @ + 1, ![r].prefill_left = 0]
    /\ UNCHANGED <<allocated, next_slot, broken>>

\* A preempted request waits again, once it owns no placeholder; it restarts from the host's
\* authoritative tokens.
Resume(r) ==
    /\ requests[r].status = PREEMPTED
    /\ LiveCount(r) = 0 \/ ResumeWithPlaceholder
    /\ requests' = [requests EXCEPT ![r].status = WAITING]
    /\ UNCHANGED <<allocated, next_slot, queue, slots, broken>>

\* The device fails step q before its readback completed: every request with a live row in it
\* fails, its rows in the other in-flight step drop (unless FaultSparesLaterRows), and the step
\* leaves the queue, so nothing of it is delivered; a failed newest step gives its slot back to
\* the ring position. Its slot is then a retired writer's, free to be released.
FaultStep(q) ==
    /\ Faults
    /\ q <= Len(queue)
    /\ queue[q].phase # READBACK_DONE
    /\ LET F == {queue[q].rows[i].req : i \in {j \in RowIds(q) : queue[q].rows[j].live}}
           dropped == IF FaultSparesLaterRows THEN queue ELSE DropQueue(F)
       IN /\ queue' = SubSeq(dropped, 1, q - 1) \o SubSeq(dropped, q + 1, Len(dropped))
          /\ slots' = IF FaultSparesLaterRows THEN slots ELSE DropSlots(F)
          /\ next_slot' = IF q = Len(queue) THEN queue[q].slot ELSE next_slot
          /\ requests' = [r \in Req |->
                            IF r \in F
                            THEN [requests[r] EXCEPT !.status = FAILED,
                                    !.closed_at = Len(requests[r].delivered), !.unchecked = FALSE]
                            ELSE requests[r]]
    /\ UNCHANGED <<allocated, broken>>

\* Everything is over: every request closed, nothing in flight, every written slot back.
IsFinal ==
    /\ allocated
    /\ queue = <<>>
    /\ \A r \in Req : requests[r].status \in Closed
    /\ \A k \in SlotIds : ~slots[k].written \/ slots[k].released

\* A final state stutters, so TLC's deadlock check flags only real deadlocks.
Done == IsFinal /\ UNCHANGED vars

\* Steps are quantified over the constant 1..Depth so TLC names each action in its graph dump.
Next ==
    \/ Allocate
    \/ \E r \in Req : Arrive(r)
    \/ Schedule
    \/ \E q \in 1 .. Depth : Combine(q)
    \/ \E q \in 1 .. Depth : Launch(q)
    \/ \E q \in 1 .. Depth : ReadbackIssue(q)
    \/ \E q \in 1 .. Depth : ReadbackComplete(q)
    \/ Apply
    \/ \E k \in SlotIds : Release(k)
    \/ \E r \in Req : FinishReq(r)
    \/ \E r \in Req : AbortReq(r)
    \/ \E r \in Req : PreemptReq(r)
    \/ \E r \in Req : Resume(r)
    \/ \E q \in 1 .. Depth : FaultStep(q)
    \/ Done

Spec == Init /\ [][Next]_vars

---------------------------------------------------------------------------------------
(* Invariants (Python: model/invariants.py). *)

\* #323-class: every combined live row consumed exactly its request's newest token.
StaleHostIdsGuard ==
    \A q \in 1 .. Len(queue) :
        queue[q].phase >= COMBINED =>
            \A i \in RowIds(q) :
                queue[q].rows[i].live =>
                    queue[q].rows[i].consumed = <<queue[q].rows[i].req, queue[q].rows[i].pos>>

\* No combine or readback ever read a slot that was handed back or rewritten under it.
NoReadOfReleasedOrOverwrittenSlot == READ_RELEASED \notin broken

\* No launch ever wrote a slot whose readback or next combine was still to happen.
NoRewriteWhileReaderOutstanding == REWRITE_WITH_READER \notin broken

\* At most D = max_concurrent_batches steps are in flight.
DepthBound == Len(queue) <= Depth

\* Per request, the user got tokens 1..n in order, each once, none past its close or max.
OutputIntegrity ==
    \A r \in Req :
        LET d == requests[r].delivered
        IN /\ d = [i \in 1 .. Len(d) |-> <<r, i>>]
           /\ Len(d) <= MaxTokens
           /\ requests[r].closed_at # NONE => Len(d) = requests[r].closed_at
           /\ requests[r].status \in Closed => requests[r].closed_at # NONE

\* A failed request has no live row in flight: nothing more is computed for it or delivered.
FailedRequestsQuiet ==
    \A q \in 1 .. Len(queue) : \A i \in RowIds(q) :
        queue[q].rows[i].live => requests[queue[q].rows[i].req].status # FAILED

\* A request the next step would combine from the mirror has its newest token in the newest
\* in-flight step: the one slot that combine reads, at any depth.
NewestTokenInNewestStep ==
    Guard /\ queue # <<>> =>
        \A r \in Eligible :
            (requests[r].status # WAITING /\ ~IsHostSync(r)) =>
                ((\E q \in 1 .. Len(queue) : MirrorRows(q, r) # {})
                    => MirrorRows(Len(queue), r) # {})
=======================================================================================
