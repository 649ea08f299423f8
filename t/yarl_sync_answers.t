#!/usr/bin/perl

# yarl_sync_answers touched: an nginx asks its roots only for the counters it decided on
# lately (answers by interest). Two nginx share one root: A accounts on two quotas; B, by
# interest, only checks one of them. B learns that one's fill (through the root, after its
# first check named it) and never hears of the other; an nginx with the default `all`
# hears of both. The root's metrics count the answers by interest.

use warnings;
use strict;

use FindBin;
use lib "$FindBin::Bin/lib";
use Test::More;
use Test::Yarl qw(http_get status_of);

sub http_block {
	my ($answers) = @_;
	return <<"EOF2";
    yarl_roots %%ROOT_A%%;
    yarl_sync_interval 200ms;
    $answers
    server {
        listen 127.0.0.1:%%PORT_8080%% reuseport;
        root %%TESTDIR%%;
        location = /count { yarl_account checked; yarl_account other; alias %%TESTDIR%%/index.html; }
        location = /check { yarl_check checked; alias %%TESTDIR%%/index.html; }
        location = /stats { access_log off; yarl_stats; }
    }
EOF2
}

my $a = Test::Yarl->new();
$a->run_root('A');
my $b = Test::Yarl->new()->use_roots_of($a);
my $c = Test::Yarl->new()->use_roots_of($a);
my %conf = ($a => '', $b => 'yarl_sync_answers touched;', $c => 'yarl_sync_answers all;');
for my $n ($a, $b, $c) {
	$n->write_file('index.html', "hello\n");
	$n->write_http_conf(http_block($conf{$n}), workers => 2);
	$n->run();
}
# 0.001/s: nothing drains during the test.
$a->put_quota($_, 0.001, 1000, 1000) for qw(checked other);
for my $n ($a, $b, $c) {
	ok($n->wait_quota($n->port(8080), $_, 5), "quota $_ fetched") for qw(checked other);
}
is($b->stats($b->port(8080), '/stats')->{sync}{answers}, 'touched', 'yarl_stats shows the setting');
is($c->stats($c->port(8080), '/stats')->{sync}{answers}, 'all', '... and the default');

my $fill = sub {
	my ($n, $q) = @_;
	my $s = $n->stats($n->port(8080), "/stats?quota=$q");
	return $s && $s->{quota} ? $s->{quota}{fill} : -1;
};

is(status_of(http_get($a->port(8080), '/count')), 200, "A counts $_") for 1 .. 10;
# Fills drain by 0.001/s: a little under what was counted.
ok($a->wait_for(sub { $fill->($c, 'other') > 9.9 }, 5), 'an nginx with all answers hears of both');
cmp_ok($fill->($c, 'checked'), '>', 9.9, '... both');
# B has decided on neither yet: the root tells it nothing.
sleep 1;
is($fill->($b, 'checked'), 0, 'by interest: not told of a quota it never decided on');
is($fill->($b, 'other'), 0, '... of either');
is(status_of(http_get($b->port(8080), '/check')), 200, 'B checks "checked"');
ok($b->wait_for(sub { $fill->($b, 'checked') > 9.9 }, 5), 'the next round brings its fill');
# Later changes reach it without another check; "other" never does.
is(status_of(http_get($a->port(8080), '/count')), 200, "A counts again $_") for 1 .. 5;
ok($b->wait_for(sub { $fill->($b, 'checked') > 14.9 }, 5), 'later changes of it reach B');
ok($c->wait_for(sub { $fill->($c, 'other') > 14.9 }, 5), 'and C');
is($fill->($b, 'other'), 0, 'B never hears of the quota it does not decide on');

my ($status, $metrics) = $a->admin('GET', '/metrics');
my ($answers) = $metrics =~ /^yarl_root_interest_answers_total (\d+)$/m;
cmp_ok($answers // 0, '>', 5, "the root counted answers by interest ($answers)");
like($metrics, qr/^yarl_root_interest_full_total 0$/m, 'none fell back for a full interest');

$_->finish() for $c, $b, $a;
done_testing();
