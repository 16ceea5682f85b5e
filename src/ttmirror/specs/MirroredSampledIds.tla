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
(*                                                                                     *)
(* Speculative decoding (SpecTokens > 0) adds fields that keep their Python defaults    *)
(* while SpecTokens = 0, so those states are exactly as before. A row's spec is an int  *)
(* (0), its drafts a sequence of tokens (<<>>), its placed -1 for None: a mirror row    *)
(* until its combine, a dropped row, and every row without drafts; a combined live row  *)
(* with drafts always has an int there, and -1 is then Python's -1 (a position the      *)
(* combine could not read). A step's accepted and host_counts are <<>> (Python: ())     *)
(* until its launch and readback; a slot's counts and positions are <<>> (()) until a   *)
(* launch with drafts writes it and once released. A request's placeholders is an int   *)
(* (0), its drafts_ready a boolean (FALSE). REJECTED is the token <<-3, -3>>.           *)
(*                                                                                     *)
(* Per-request state rows (RowsState, spec rule 14) add the variable table, a function  *)
(* over 0 .. StateRows - 1 (empty with the ring: Python's ()), a row's idx and a         *)
(* request's state_row (-1 = NONE with the ring, as in Python). A dropped row keeps its *)
(* req and idx with state rows (its launch still scatters there), and is DeadRow with   *)
(* the ring. Subsets: a step holds any non-empty subset of the eligible requests, and   *)
(* with drafts each row any number of the drafts it has.                                *)
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
    FaultSparesLaterRows,   \* known-bad: a fault leaves its failed requests' other rows live
    SpecTokens,             \* K drafts per decoding row, verified on the device; 0 = none
    PositionsAdvanceBySpec, \* known-bad: the device advances a position by 1 + K, not a + 1
    RejectedDraftNewest,    \* known-bad: a rejected draft is kept as the row's newest token
    ReenteringDraftsFromDevice, \* known-bad: a re-entering request gets K placeholder drafts
    PlaceholdersDrainByOne, \* known-bad: apply drains a row's yielded placeholders by 1
    RowsState,              \* a state row per request (model runner v2), else the ring
    StateRows,              \* with RowsState: the state rows on the device; 0 with the ring
    Subsets,                \* vLLM's freedoms: any subset of requests, any drafts per row
    StateRowReusedInFlight, \* known-bad: a closed owner's row released with a step in flight
    IdxFromPreviousOrder,   \* known-bad: a step's idx_mapping is the previous step's
    DraftCountOfAnotherRow, \* known-bad: every row's draft count is the first row's
    SkippedFromPreviousStep \* known-bad: in-flight tokens looked for in the previous step only

Req == 0 .. Requests - 1
SlotIds == 0 .. Slots - 1
StateRowIds == 0 .. StateRows - 1

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
REJECTED == <<-3, -3>>      \* a draft verification rejected: never a token of any sequence
NONE == -1

READ_RELEASED == "NoReadOfReleasedOrOverwrittenSlot"
REWRITE_WITH_READER == "NoRewriteWhileReaderOutstanding"
WRITE_UNHELD_ROW == "NoWriteToUnheldStateRow"

\* A dropped row: its token is never delivered nor read, so what it held is forgotten.
DeadRow == [req |-> NONE, pos |-> 0, prev_row |-> NONE, consumed |-> <<>>, live |-> FALSE,
            partial |-> FALSE, spec |-> 0, placed |-> NONE, drafts |-> <<>>, idx |-> NONE]

\* A row dropped: with state rows it keeps its request and idx (its launch still scatters).
Dead(row) == IF row.idx = NONE THEN DeadRow ELSE [DeadRow EXCEPT !.req = row.req, !.idx = row.idx]

\* A state row no request holds; what it held is forgotten.
FreeRow == [owner |-> NONE, newest |-> GARBAGE, position |-> -1]

VARIABLES
    allocated,  \* the ring exists (allocated at load, before any trace capture)
    next_slot,  \* the slot the next scheduled step takes
    queue,      \* in-flight steps, oldest first: [slot, src_slot, phase, rows, host_copy,
                \*                                  accepted, host_counts]
    slots,      \* per slot: [written, content, released, counts, positions]
    requests,   \* per request: [status, delivered, closed_at, unchecked, preemptions,
                \*               prefill_left, placeholders, drafts_ready]
    broken,     \* ghost: the slot rules an access broke at the moment it happened
    table       \* with state rows, per state row: [owner, newest, position]

vars == <<allocated, next_slot, queue, slots, requests, broken, table>>

---------------------------------------------------------------------------------------
(* Type invariant. *)

Token == (Req \X Int) \cup {PLACEHOLDER, GARBAGE, REJECTED}
Row == [req: Req \cup {NONE}, pos: Int, prev_row: (0 .. Requests - 1) \cup {NONE},
        consumed: Token \cup {<<>>}, live: BOOLEAN, partial: BOOLEAN,
        spec: 0 .. SpecTokens, placed: Int, drafts: Seq(Token), idx: StateRowIds \cup {NONE}]

TypeOK ==
    /\ allocated \in BOOLEAN
    /\ next_slot \in SlotIds
    /\ Len(queue) <= Depth
    /\ \A q \in 1 .. Len(queue) :
          /\ queue[q].slot \in SlotIds
          /\ queue[q].src_slot \in SlotIds \cup {NONE}
          /\ queue[q].phase \in SCHEDULED .. READBACK_DONE
          /\ \A i \in 1 .. Len(queue[q].rows) : queue[q].rows[i] \in Row
          /\ queue[q].accepted \in Seq(0 .. SpecTokens)
          /\ queue[q].host_counts \in Seq(Nat)
    /\ \A k \in SlotIds :
          /\ slots[k].written \in BOOLEAN /\ slots[k].released \in BOOLEAN
          /\ slots[k].counts \in Seq(Nat) /\ slots[k].positions \in Seq(Int)
    /\ \A r \in Req :
          /\ requests[r].status \in ABSENT .. FAILED
          /\ Len(requests[r].delivered) <= MaxTokens
          /\ requests[r].preemptions \in 0 .. Preemptions
          /\ requests[r].prefill_left \in 0 .. PrefillChunks - 1
          /\ requests[r].placeholders \in Nat
          /\ requests[r].drafts_ready \in BOOLEAN
          /\ requests[r].state_row \in StateRowIds \cup {NONE}
    /\ \A k \in StateRowIds :
          table[k] \in [owner: Req \cup {NONE}, newest: Token, position: Int]
    /\ broken \subseteq {READ_RELEASED, REWRITE_WITH_READER, WRITE_UNHELD_ROW}

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

\* Some in-flight step has a row, live or dropped, whose launch scatters into state row k.
RowInFlight(k) == \E q \in 1 .. Len(queue) : \E i \in RowIds(q) : queue[q].rows[i].idx = k

\* r needs its newest token on the host before its next step.
IsHostSync(r) == HostSync /\ r = 0

\* Position of r's newest token: delivered ones plus those still in flight. With drafts, the
\* fewest it can be: each in-flight step yields at least one token.
NextPos(r) == Len(requests[r].delivered) + LiveCount(r)

\* The host's output placeholders of r: its own counter with drafts, else its live rows.
Placeholders(r) == IF SpecTokens > 0 THEN requests[r].placeholders ELSE LiveCount(r)

\* With drafts: the tokens step j's launch yielded for r (a + 1 for its live row).
Yielded(j, r) ==
    LET st == queue[j]
        hits == {i \in RowIds(j) : /\ i <= Len(st.accepted) /\ st.rows[i].live
                                   /\ ~st.rows[i].partial /\ st.rows[i].req = r}
    IN IF hits = {} THEN 0 ELSE st.accepted[CHOOSE i \in hits : TRUE] + 1

\* With drafts: what the steps before step q yielded for r (all launched by q's combine).
RECURSIVE YieldedBefore(_, _)
YieldedBefore(q, r) == IF q <= 1 THEN 0 ELSE YieldedBefore(q - 1, r) + Yielded(q - 1, r)

\* With drafts: the position of r's newest token as step q's combine must see it.
TruePos(q, r) == Len(requests[r].delivered) + YieldedBefore(q, r)

\* The drafter's k proposals after token t, for the k positions that follow it; garbage in,
\* garbage out.
DraftsAfter(t, k) == IF t[1] < 0 THEN [i \in 1 .. k |-> t]
                     ELSE [i \in 1 .. k |-> <<t[1], t[2] + i>>]

\* With drafts: the count tokens a row yielded, read back: its accepted drafts (the sequence's
\* tokens after row.pos) then its newest; none for an unreadable count.
Expand(row, newest, count) ==
    IF count = 0 THEN <<>>
    ELSE [i \in 1 .. count - 1 |-> <<row.req, row.pos + i>>] \o <<newest>>

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

\* With drafts: the count the device holds for row (0-based) of slot k; an unreadable one
\* reads as 1 (the host then delivers the garbage token it read beside it).
ReadCount(k, row) ==
    IF ~slots[k].written \/ slots[k].released \/ row >= Len(slots[k].counts) THEN 1
    ELSE slots[k].counts[row + 1]

\* Forget the tokens of the requests in R: nothing reads them again once their rows drop.
Scrub(R, ts) == [i \in 1 .. Len(ts) |-> IF ts[i][1] \in R THEN GARBAGE ELSE ts[i]]

\* Slot s with the tokens of R forgotten, and with drafts their counts and positions.
ScrubSlot(R, s) ==
    IF s.counts = <<>> THEN [s EXCEPT !.content = Scrub(R, s.content)]
    ELSE [s EXCEPT
            !.content = Scrub(R, s.content),
            !.counts = [i \in 1 .. Len(s.counts) |->
                          IF s.content[i][1] \in R THEN 0 ELSE s.counts[i]],
            !.positions = [i \in 1 .. Len(s.positions) |->
                             IF s.content[i][1] \in R THEN -1 ELSE s.positions[i]]]

\* Drop every row of the requests in R in the steps Q and forget their tokens in host copies
\* (Python: _drop, once per request); DropSlots forgets them in the slots, DropTable in their
\* state rows (read again only after a host row of theirs rewrote them, if ever).
DropQueueOf(Q, R) ==
    [q \in 1 .. Len(Q) |->
        [Q[q] EXCEPT
            !.rows = [i \in 1 .. Len(Q[q].rows) |-> IF Q[q].rows[i].req \in R
                                                    THEN Dead(Q[q].rows[i])
                                                    ELSE Q[q].rows[i]],
            !.host_copy = Scrub(R, Q[q].host_copy)]]
DropQueue(R) == DropQueueOf(queue, R)
DropSlots(R) == [k \in SlotIds |-> ScrubSlot(R, slots[k])]
DropTable(R) == [k \in StateRowIds |->
                   IF table[k].owner \in R
                   THEN [table[k] EXCEPT !.newest = GARBAGE, !.position = -1] ELSE table[k]]

\* Some step of Q holds a live row of r (HasStepInFlight over other steps than the queue's).
HasRowIn(Q, r) == \E q \in 1 .. Len(Q) : \E i \in 1 .. Len(Q[q].rows) :
                      Q[q].rows[i].live /\ Q[q].rows[i].req = r

\* Rows of step q whose sampled id is r's newest token for a later combine to read through the
\* previous-row map: live, and not a partial prefill's discarded id (Python: mirror_rows).
MirrorRows(q, r) ==
    {i \in RowIds(q) : /\ queue[q].rows[i].live /\ queue[q].rows[i].req = r
                       /\ (PartialFeedsMirror \/ ~queue[q].rows[i].partial)}

\* r's newest token is still in flight (Python: newest_on_device).
NewestOnDevice(r) == \E q \in 1 .. Len(queue) : MirrorRows(q, r) # {}

\* With state rows: row i's entry of a step scheduled now for r in its idx_mapping (the
\* known-bad variant reuses the previous step's); NONE with the ring.
Idx(r, i) ==
    IF ~RowsState THEN NONE
    ELSE IF IdxFromPreviousOrder /\ queue # <<>> /\ i <= Len(queue[Len(queue)].rows)
    THEN queue[Len(queue)].rows[i].idx
    ELSE requests[r].state_row

\* Where row i of a step scheduled now reads r's newest token on the device, under the guard:
\* the ring, r's row in the previous (newest) in-flight step, if live there (the previous-row
\* map); state rows, its state row if its newest token is in flight (the known-bad variant
\* looks in the previous step only). Arrived, resumed and host-sync requests take host ids; a
\* partial row is never mirrored. NONE: host ids.
PrevRow(r, i) ==
    IF ~Guard \/ queue = <<>> \/ requests[r].status = WAITING \/ IsHostSync(r) THEN NONE
    ELSE IF RowsState
    THEN IF (IF SkippedFromPreviousStep THEN MirrorRows(Len(queue), r) # {}
             ELSE NewestOnDevice(r))
         THEN Idx(r, i) ELSE NONE
    ELSE LET hits == MirrorRows(Len(queue), r)
         IN IF hits = {} THEN NONE ELSE (CHOOSE i2 \in hits : TRUE) - 1

\* How many drafts the host schedules after r's newest token: K if the drafter proposed them
\* (it was in the last scheduled step past its prompt), else none; the known-bad variant gives
\* a re-entering request past its prompt K placeholder drafts anyway.
DraftsScheduled(r, partial) ==
    IF partial THEN 0
    ELSE IF requests[r].drafts_ready /\ requests[r].status # WAITING THEN SpecTokens
    ELSE IF ReenteringDraftsFromDevice /\ Len(requests[r].delivered) > 0 THEN SpecTokens
    ELSE 0

\* Row i of a step scheduled now for request r, carrying d drafts where the scheduler chooses
\* (Subsets): without drafts the host knows its position; with drafts a mirror row's position,
\* newest token and drafts are on the device (set at the combine), and a host row stages the
\* host's count of computed tokens and the drafts read back after its newest token
\* (placeholders where the host has none).
NewRow(r, i, d) ==
    LET partial == requests[r].prefill_left > 0
        prev == PrevRow(r, i)
        spec == IF Subsets THEN d ELSE DraftsScheduled(r, partial)
        placed == Len(requests[r].delivered) + requests[r].placeholders
        base == [req |-> r, pos |-> NextPos(r), prev_row |-> prev, consumed |-> <<>>,
                 live |-> TRUE, partial |-> partial, spec |-> 0, placed |-> NONE,
                 drafts |-> <<>>, idx |-> Idx(r, i)]
    IN IF SpecTokens = 0 THEN base
       ELSE IF prev # NONE THEN [base EXCEPT !.pos = -1, !.spec = spec]
       ELSE [base EXCEPT !.pos = -1, !.spec = spec, !.placed = placed,
                         !.drafts = IF requests[r].drafts_ready
                                    THEN DraftsAfter(HostToken(r, placed), spec)
                                    ELSE [j \in 1 .. spec |-> PLACEHOLDER]]

\* With drafts: a live row consumed its request's newest token, at its position, and the
\* drafter's proposals for the positions after it.
InputsRight(row) ==
    /\ row.consumed = <<row.req, row.pos>>
    /\ row.placed = row.pos
    /\ row.drafts = DraftsAfter(<<row.req, row.pos>>, row.spec)

\* With drafts: the most drafts step q's verification can accept of row i (0 unless its
\* inputs are right), and the launch's possible verdicts, one accepted count per row.
Top(q, i) == LET row == queue[q].rows[i]
             IN IF row.live /\ ~row.partial /\ InputsRight(row) THEN row.spec ELSE 0
Choices(q) == {f \in [RowIds(q) -> 0 .. SpecTokens] : \A i \in RowIds(q) : f[i] <= Top(q, i)}

\* The request sets a step may hold: every eligible one, or with Subsets any non-empty subset.
Groups == IF Subsets THEN SUBSET Eligible \ {{}} ELSE {Eligible}

\* Each row's drafts for a step in this order: chosen up to those it has with Subsets and
\* drafts (one function per choice), else all zero (unused: NewRow takes DraftsScheduled).
DraftChoices(order) ==
    IF Subsets /\ SpecTokens > 0
    THEN {f \in [DOMAIN order -> 0 .. SpecTokens] :
            \A i \in DOMAIN order :
                f[i] <= DraftsScheduled(order[i], requests[order[i]].prefill_left > 0)}
    ELSE {[i \in DOMAIN order |-> 0]}
---------------------------------------------------------------------------------------
(* Actions, one definition each (Python: model/actions.py). *)

Init ==
    /\ allocated = FALSE
    /\ next_slot = 0
    /\ queue = <<>>
    /\ slots = [k \in SlotIds |-> [written |-> FALSE, content |-> <<>>, released |-> FALSE,
                                   counts |-> <<>>, positions |-> <<>>]]
    /\ requests = [r \in Req |-> [status |-> ABSENT, delivered |-> <<>>, closed_at |-> NONE,
                                  unchecked |-> FALSE, preemptions |-> 0,
                                  prefill_left |-> PrefillChunks - 1,
                                  placeholders |-> 0, drafts_ready |-> FALSE,
                                  state_row |-> NONE]]
    /\ broken = {}
    /\ table = [k \in StateRowIds |-> FreeRow]

\* Load: allocate the ring of K mirror slots, before any step (and so any trace capture).
Allocate ==
    /\ ~allocated
    /\ allocated' = TRUE
    /\ UNCHANGED <<next_slot, queue, slots, requests, broken, table>>

\* A request arrives; its first step prefills from host ids. With state rows it is given the
\* lowest free state row (none free: it waits).
Arrive(r) ==
    /\ allocated
    /\ requests[r].status = ABSENT
    /\ IF ~RowsState
       THEN /\ requests' = [requests EXCEPT ![r].status = WAITING]
            /\ UNCHANGED table
       ELSE LET free == {k \in StateRowIds : table[k].owner = NONE}
                k == CHOOSE k \in free : \A j \in free : k <= j
            IN /\ free # {}
               /\ table' = [table EXCEPT ![k] = [FreeRow EXCEPT !.owner = r]]
               /\ requests' = [requests EXCEPT ![r].status = WAITING, ![r].state_row = k]
    /\ UNCHANGED <<allocated, next_slot, queue, slots, broken>>

\* Schedule a step over the eligible requests (every one, or with Subsets any non-empty subset)
\* in some order, building the previous-row map (the ring) or the idx_mapping (state rows).
Schedule ==
    /\ allocated
    /\ Len(queue) < Depth
    /\ Eligible # {}
    /\ \E group \in Groups : \E order \in Orders(group) : \E ds \in DraftChoices(order) :
        /\ Condense \/ Ascending(order)
        /\ LET rows == [i \in DOMAIN order |-> NewRow(order[i], i, ds[i])]
               mirror == ~RowsState /\ \E i \in DOMAIN rows : rows[i].prev_row # NONE
               step == [slot |-> next_slot,
                        src_slot |-> IF mirror THEN queue[Len(queue)].slot ELSE NONE,
                        phase |-> SCHEDULED, rows |-> rows, host_copy |-> <<>>,
                        accepted |-> <<>>, host_counts |-> <<>>]
               \* With drafts: r's row in this step yields (1 + spec placeholders), and drafts
               \* follow this step's rows (a request left out by Subsets, or with state rows,
               \* keeps its own).
               Yields(r) == /\ r \in Range(order)
                            /\ ~rows[CHOOSE i \in DOMAIN order : order[i] = r].partial
               Owed(r) == 1 + rows[CHOOSE i \in DOMAIN order : order[i] = r].spec
               Stepped(r) == IF r \in Range(order)
                             THEN [requests[r] EXCEPT !.status = RUNNING, !.unchecked = FALSE,
                                     !.prefill_left = IF @ > 0 THEN @ - 1 ELSE 0]
                             ELSE requests[r]
           IN /\ queue' = Append(queue, step)
              /\ next_slot' = (next_slot + 1) % Slots
              /\ requests' = [r \in Req |->
                                IF SpecTokens = 0 THEN Stepped(r)
                                ELSE [Stepped(r) EXCEPT
                                        !.placeholders = @ + (IF Yields(r) THEN Owed(r) ELSE 0),
                                        !.drafts_ready = IF r \in Range(order) THEN Yields(r)
                                                         ELSE (RowsState \/ Subsets) /\ @]]
    /\ UNCHANGED <<allocated, slots, broken, table>>

\* Build step q's input ids on device: host ids, or the previous slot through the row map.
Combine(q) ==
    /\ q <= Len(queue)
    /\ queue[q].phase = SCHEDULED
    /\ IF q = 1 THEN TRUE ELSE queue[q - 1].phase >= LAUNCHED  \* previous slot written
    /\ LET st == queue[q]
           Value(row) == IF row.prev_row = NONE THEN HostToken(row.req, row.pos)
                         ELSE IF RowsState THEN table[row.idx].newest
                         ELSE ReadSlot(st.src_slot, row.prev_row)
           \* With drafts: newest token, position and drafts from the host (a host row, staged
           \* when scheduled), or on the device: the previous slot (the ring) or the row's state
           \* row (state rows), its draft count from the step's per-row counts (the known-bad
           \* variant: the first row's); pos := the true position.
           count(row) == IF DraftCountOfAnotherRow THEN st.rows[1].spec ELSE row.spec
           WithDrafts(row) ==
               IF row.prev_row = NONE
               THEN [row EXCEPT !.pos = TruePos(q, row.req),
                                !.consumed = HostToken(row.req, row.placed)]
               ELSE IF RowsState
               THEN LET newest == table[row.idx].newest
                    IN [row EXCEPT !.pos = TruePos(q, row.req), !.consumed = newest,
                                   !.placed = IF newest # GARBAGE THEN table[row.idx].position
                                              ELSE -1,
                                   !.drafts = DraftsAfter(newest, count(row))]
               ELSE LET newest == ReadSlot(st.src_slot, row.prev_row)
                        src == slots[st.src_slot]
                        readable == newest # GARBAGE /\ row.prev_row < Len(src.positions)
                    IN [row EXCEPT !.pos = TruePos(q, row.req), !.consumed = newest,
                                   !.placed = IF readable THEN src.positions[row.prev_row + 1]
                                              ELSE -1,
                                   !.drafts = DraftsAfter(newest, count(row))]
           Combined(row) == IF SpecTokens > 0 THEN WithDrafts(row)
                            ELSE [row EXCEPT !.consumed = Value(row)]
           rows == [i \in RowIds(q) |-> IF ~st.rows[i].live THEN st.rows[i]
                                        ELSE Combined(st.rows[i])]
           mirror == ~RowsState /\ \E i \in RowIds(q) :
                                      st.rows[i].live /\ st.rows[i].prev_row # NONE
       IN /\ queue' = [queue EXCEPT ![q] = [st EXCEPT !.phase = COMBINED, !.rows = rows]]
          /\ broken' = IF mirror /\ slots[st.src_slot].released
                       THEN broken \cup {READ_RELEASED} ELSE broken
    /\ UNCHANGED <<allocated, next_slot, slots, requests, table>>

\* Run step q's forward and sampler; the sampler writes its tokens into the step's slot. With
\* drafts, verification accepts acc[i] drafts of row i (chosen: the model does not know which
\* guesses the target agrees with) and the device advances the row's position.
Launch(q) ==
    /\ q <= Len(queue)
    /\ queue[q].phase = COMBINED
    /\ LET st == queue[q]
           Sampled(row) == IF row.live /\ ~row.partial /\ row.consumed = <<row.req, row.pos>>
                        THEN <<row.req, row.pos + 1>> ELSE GARBAGE
           \* With drafts (Python: _verify): a row's newest token (the target's after its a
           \* accepted drafts), its count a + 1 and its advanced position; none for a dropped
           \* or partial row.
           Yields(row) == row.live /\ ~row.partial
           Newest(row, a) ==
               IF ~Yields(row) \/ ~InputsRight(row) THEN GARBAGE
               ELSE IF RejectedDraftNewest /\ a < row.spec THEN REJECTED
               ELSE <<row.req, row.pos + a + 1>>
           Count(row, a) == IF Yields(row) THEN a + 1 ELSE 0
           Advanced(row, a) ==
               IF ~Yields(row) THEN -1
               ELSE row.placed + (IF PositionsAdvanceBySpec THEN 1 + row.spec ELSE a + 1)
           \* With state rows (Python: _post_update): each row's newest token and position go
           \* to the state row its idx names (the last row naming it wins), dropped rows too,
           \* forgotten there; scattering into a row its request no longer holds is a break.
           Hits(k) == {i \in RowIds(q) : st.rows[i].idx = k}
           Last(k) == CHOOSE i \in Hits(k) : \A j \in Hits(k) : j <= i
           Scatter(newest, position) ==
               [k \in StateRowIds |->
                   IF Hits(k) = {} THEN table[k]
                   ELSE [table[k] EXCEPT
                           !.newest = IF st.rows[Last(k)].live THEN newest[Last(k)] ELSE GARBAGE,
                           !.position = IF SpecTokens > 0 /\ st.rows[Last(k)].live
                                        THEN position[Last(k)] ELSE -1]]
           unheld == RowsState /\ \E i \in RowIds(q) : table[st.rows[i].idx].owner # st.rows[i].req
       IN /\ broken' = broken \cup (IF ReadersOutstanding(st.slot, q)
                                    THEN {REWRITE_WITH_READER} ELSE {})
                             \cup (IF unheld THEN {WRITE_UNHELD_ROW} ELSE {})
          /\ IF SpecTokens = 0
             THEN LET content == [i \in RowIds(q) |-> Sampled(st.rows[i])]
                  IN /\ slots' = [slots EXCEPT ![st.slot] =
                                    [@ EXCEPT !.written = TRUE, !.released = FALSE,
                                     !.content = content]]
                     /\ queue' = [queue EXCEPT ![q].phase = LAUNCHED]
                     /\ table' = IF RowsState THEN Scatter(content, content) ELSE table
             ELSE \E acc \in Choices(q) :
                  LET content == [i \in RowIds(q) |-> Newest(st.rows[i], acc[i])]
                      advanced == [i \in RowIds(q) |-> Advanced(st.rows[i], acc[i])]
                  IN /\ slots' = [slots EXCEPT ![st.slot] =
                                    [@ EXCEPT !.written = TRUE, !.released = FALSE,
                                     !.content = content,
                                     !.counts = [i \in RowIds(q) |-> Count(st.rows[i], acc[i])],
                                     \* with state rows the positions go to the state rows
                                     !.positions = IF RowsState THEN <<>> ELSE advanced]]
                     /\ queue' = [queue EXCEPT ![q].phase = LAUNCHED, ![q].accepted = acc]
                     /\ table' = IF RowsState THEN Scatter(content, advanced) ELSE table
    /\ UNCHANGED <<allocated, next_slot, requests>>

\* Enqueue the non-blocking copy of step q's slot to a host tensor, and its event.
ReadbackIssue(q) ==
    /\ q <= Len(queue)
    /\ queue[q].phase = LAUNCHED
    /\ queue' = [queue EXCEPT ![q].phase = READBACK_ISSUED]
    /\ UNCHANGED <<allocated, next_slot, slots, requests, broken, table>>

\* Step q's readback event completes: the host tensor now holds the slot's content.
ReadbackComplete(q) ==
    /\ q <= Len(queue)
    /\ queue[q].phase = READBACK_ISSUED
    /\ LET st == queue[q]
       IN /\ queue' = [queue EXCEPT ![q] =
                         [st EXCEPT !.phase = READBACK_DONE,
                                    !.host_copy = [i \in RowIds(q) |-> ReadSlot(st.slot, i - 1)],
                                    \* with drafts the counts come back with the tokens
                                    !.host_counts = IF SpecTokens = 0 THEN @
                                                    ELSE [i \in RowIds(q) |->
                                                            ReadCount(st.slot, i - 1)]]]
          /\ broken' = IF slots[st.slot].released \/ Writer(st.slot) # q
                       THEN broken \cup {READ_RELEASED} ELSE broken
    /\ UNCHANGED <<allocated, next_slot, slots, requests, table>>

\* Retire the oldest step: deliver each live row's tokens; max tokens finishes a request, and
\* drops its rows still in flight (with drafts a later step may carry it).
Apply ==
    /\ queue # <<>>
    /\ queue[1].phase = READBACK_DONE
    /\ LET st == queue[1]
           Hits(r) == {i \in RowIds(1) :
                         st.rows[i].live /\ ~st.rows[i].partial /\ st.rows[i].req = r}
           At(r) == CHOOSE i \in Hits(r) : TRUE
           \* With drafts: drain what the row yielded, roll back what it rejected (together the
           \* 1 + spec it was scheduled); the known-bad variant drains 1 for the yielded ones.
           Count(r) == st.host_counts[At(r)]
           Drained(r) == (IF PlaceholdersDrainByOne THEN 1 ELSE Count(r))
                         + (st.rows[At(r)].spec + 1 - Count(r))
           Owed(r) == IF SpecTokens = 0 THEN requests[r].placeholders
                      ELSE LET left == requests[r].placeholders - Drained(r)
                           IN IF left > 0 THEN left ELSE 0
           \* With drafts a run past max tokens is cut there (as vLLM's stop check cuts it).
           New(r) ==
               IF SpecTokens = 0 THEN Append(requests[r].delivered, st.host_copy[At(r)])
               ELSE LET d == requests[r].delivered
                               \o Expand(st.rows[At(r)], st.host_copy[At(r)], Count(r))
                    IN SubSeq(d, 1, IF Len(d) < MaxTokens THEN Len(d) ELSE MaxTokens)
           Deliver(r) ==
               LET d == New(r)
               IN IF Len(d) >= MaxTokens
                  THEN [requests[r] EXCEPT !.status = FINISHED, !.delivered = d,
                                           !.closed_at = Len(d), !.unchecked = FALSE,
                                           !.placeholders = Owed(r)]
                  ELSE [requests[r] EXCEPT !.delivered = d, !.unchecked = TRUE,
                                           !.placeholders = Owed(r)]
           applied == [r \in Req |-> IF Hits(r) = {} THEN requests[r] ELSE Deliver(r)]
           rest == Tail(queue)
           dropped == {r \in Req : /\ Hits(r) # {} /\ Len(New(r)) >= MaxTokens
                                   /\ HasRowIn(rest, r)}
       IN /\ queue' = DropQueueOf(rest, dropped)
          /\ slots' = DropSlots(dropped)
          /\ table' = DropTable(dropped)
          /\ requests' = [r \in Req |->
                            IF r \in dropped
                            THEN [applied[r] EXCEPT !.placeholders = 0, !.drafts_ready = FALSE]
                            ELSE applied[r]]
    /\ UNCHANGED <<allocated, next_slot, broken>>

\* Hand a slot back: its readback is done and no combine will read it again.
Release(k) ==
    /\ allocated
    /\ slots[k].written
    /\ ~slots[k].released
    /\ IF ReleaseAtIssue
       THEN IF Writer(k) = 0 THEN TRUE ELSE queue[Writer(k)].phase >= READBACK_ISSUED
       ELSE /\ Writer(k) = 0
            /\ ~\E j \in 1 .. Len(queue) : queue[j].src_slot = k /\ queue[j].phase = SCHEDULED
    /\ slots' = [slots EXCEPT ![k] = [written |-> TRUE, content |-> <<>>, released |-> TRUE,
                                      counts |-> <<>>, positions |-> <<>>]]
    /\ UNCHANGED <<allocated, next_slot, queue, requests, broken, table>>

\* With state rows: hand state row k back once its owner closed and no in-flight step will
\* still scatter into it (the known-bad variant: at close); the next arrival may take it.
ReleaseRow(k) ==
    /\ RowsState
    /\ table[k].owner # NONE
    /\ requests[table[k].owner].status \in Closed
    /\ ~RowInFlight(k) \/ StateRowReusedInFlight
    /\ table' = [table EXCEPT ![k] = FreeRow]
    /\ requests' = [requests EXCEPT ![table[k].owner].state_row = NONE]
    /\ UNCHANGED <<allocated, next_slot, queue, slots, broken>>

\* The newest delivered token was a stop token: the request finishes, in-flight rows drop.
FinishReq(r) ==
    /\ Finish
    /\ requests[r].status \notin Closed
    /\ requests[r].unchecked
    /\ queue' = DropQueue({r})
    /\ slots' = DropSlots({r})
    /\ table' = DropTable({r})
    /\ requests' = [requests EXCEPT ![r].status = FINISHED,
                                    ![r].closed_at = Len(requests[r].delivered),
                                    ![r].unchecked = FALSE,
                                    ![r].placeholders = 0, ![r].drafts_ready = FALSE]
    /\ UNCHANGED <<allocated, next_slot, broken>>

\* The user aborts the request: nothing more is delivered, in-flight rows drop.
AbortReq(r) ==
    /\ Abort
    /\ requests[r].status \in {WAITING, RUNNING, PREEMPTED}
    /\ queue' = DropQueue({r})
    /\ slots' = DropSlots({r})
    /\ table' = DropTable({r})
    /\ requests' = [requests EXCEPT ![r].status = ABORTED,
                                    ![r].closed_at = Len(requests[r].delivered),
                                    ![r].unchecked = FALSE,
                                    ![r].placeholders = 0, ![r].drafts_ready = FALSE]
    /\ UNCHANGED <<allocated, next_slot, broken>>

\* The KV budget is exceeded: the request is preempted; its in-flight tokens are kept and
\* delivered (PreemptKeep), or dropped with their placeholders. It will prefill again in one
\* step; drafts after its newest token are no more.
PreemptReq(r) ==
    /\ Preempt
    /\ requests[r].status = RUNNING
    /\ requests[r].preemptions < Preemptions
    /\ queue' = IF PreemptKeep THEN queue ELSE DropQueue({r})
    /\ slots' = IF PreemptKeep THEN slots ELSE DropSlots({r})
    /\ table' = IF PreemptKeep THEN table ELSE DropTable({r})
    /\ requests' = [requests EXCEPT ![r].status = PREEMPTED, ![r].unchecked = FALSE,
                                    ![r].preemptions = @ + 1, ![r].prefill_left = 0,
                                    ![r].drafts_ready = FALSE,
                                    ![r].placeholders = IF PreemptKeep THEN @ ELSE 0]
    /\ UNCHANGED <<allocated, next_slot, broken>>

\* A preempted request waits again, once it owns no placeholder; it restarts from the host's
\* authoritative tokens.
Resume(r) ==
    /\ requests[r].status = PREEMPTED
    /\ Placeholders(r) = 0 \/ ResumeWithPlaceholder
    /\ requests' = [requests EXCEPT ![r].status = WAITING]
    /\ UNCHANGED <<allocated, next_slot, queue, slots, broken, table>>

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
          /\ table' = IF FaultSparesLaterRows THEN table ELSE DropTable(F)
          /\ next_slot' = IF q = Len(queue) THEN queue[q].slot ELSE next_slot
          /\ requests' = [r \in Req |->
                            IF r \in F
                            THEN [requests[r] EXCEPT !.status = FAILED,
                                    !.closed_at = Len(requests[r].delivered), !.unchecked = FALSE,
                                    \* a dropped request's placeholders go with its rows
                                    !.placeholders = IF FaultSparesLaterRows THEN @ ELSE 0,
                                    !.drafts_ready = @ /\ FaultSparesLaterRows]
                            ELSE requests[r]]
    /\ UNCHANGED <<allocated, broken>>

\* Everything is over: every request closed, nothing in flight, every written slot and every
\* state row back.
IsFinal ==
    /\ allocated
    /\ queue = <<>>
    /\ \A r \in Req : requests[r].status \in Closed
    /\ \A k \in SlotIds : ~slots[k].written \/ slots[k].released
    /\ \A k \in StateRowIds : table[k].owner = NONE

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
    \/ \E k \in StateRowIds : ReleaseRow(k)
    \/ Done

Spec == Init /\ [][Next]_vars

---------------------------------------------------------------------------------------
(* Invariants (Python: model/invariants.py). *)

\* #323-class: every combined live row consumed exactly its request's newest token, and with
\* drafts its true position and the drafter's proposals after it.
StaleHostIdsGuard ==
    \A q \in 1 .. Len(queue) :
        queue[q].phase >= COMBINED =>
            \A i \in RowIds(q) :
                queue[q].rows[i].live =>
                    /\ queue[q].rows[i].consumed = <<queue[q].rows[i].req, queue[q].rows[i].pos>>
                    /\ SpecTokens = 0 \/ InputsRight(queue[q].rows[i])

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
    Guard /\ queue # <<>> /\ ~Subsets =>
        \A r \in Eligible :
            (requests[r].status # WAITING /\ ~IsHostSync(r)) =>
                ((\E q \in 1 .. Len(queue) : MirrorRows(q, r) # {})
                    => MirrorRows(Len(queue), r) # {})

\* No launch ever scattered a row into a state row its request no longer held (released,
\* or another's).
NoWriteToUnheldStateRow == WRITE_UNHELD_ROW \notin broken

\* Each arrived, unreleased request owns exactly the state row it names, and each owned state
\* row names its owner.
StateRowsOwned ==
    /\ \A r \in Req :
          /\ requests[r].status \in {WAITING, RUNNING, PREEMPTED} => requests[r].state_row # NONE
          /\ requests[r].state_row # NONE => table[requests[r].state_row].owner = r
    /\ \A k \in StateRowIds : table[k].owner # NONE => requests[table[k].owner].state_row = k

\* A request whose in-flight steps have all launched holds its newest token in its state row
\* (and with drafts its position): what its next combine gathers, however many steps ago it ran.
NewestTokenInStateRow ==
    Guard =>
        \A r \in Req :
            (/\ requests[r].state_row # NONE /\ requests[r].status \notin Closed
             /\ NewestOnDevice(r)) =>
                LET steps == {q \in 1 .. Len(queue) : \E i \in RowIds(q) :
                                  queue[q].rows[i].live /\ queue[q].rows[i].req = r}
                    last == CHOOSE q \in steps : \A p \in steps : p <= q
                    newest == <<r, IF SpecTokens > 0
                                   THEN Len(requests[r].delivered) + YieldedBefore(Len(queue) + 1, r)
                                   ELSE Len(requests[r].delivered) + LiveCount(r)>>
                IN queue[last].phase >= LAUNCHED => table[requests[r].state_row].newest = newest
=======================================================================================
